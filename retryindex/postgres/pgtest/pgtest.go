// Package pgtest starts a real PostgreSQL server for tests (Debian's postgresql package: initdb in a
// temporary directory, a Unix socket only, as the postgres user when the tests run as root) and gives
// each test a database of its own. A test skips, saying why, when no server binary exists. It is for
// tests only: call [Stop] from TestMain after the tests ran.
package pgtest

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// server is the PostgreSQL server the tests of one package share: started on first use, stopped by
// Stop.
var server struct {
	once    sync.Once
	dir     string
	bin     string
	conn    string // to the "postgres" database
	skip    string // why the tests skip: no server binary here
	err     error
	creds   *syscall.Credential
	created atomic.Int64
}

// findBin returns the directory of Debian's PostgreSQL server binaries (initdb, pg_ctl), or "".
func findBin() string {
	if p, err := exec.LookPath("initdb"); err == nil {
		if real, err := filepath.EvalSymlinks(p); err == nil {
			return filepath.Dir(real)
		}
		return filepath.Dir(p)
	}
	matches, _ := filepath.Glob("/usr/lib/postgresql/*/bin/initdb")
	if len(matches) > 0 {
		return filepath.Dir(matches[len(matches)-1])
	}
	return ""
}

// command runs a server binary, as the postgres user when the tests run as root (initdb and the
// server refuse root).
func command(name string, args ...string) *exec.Cmd {
	cmd := exec.Command(filepath.Join(server.bin, name), args...)
	if server.creds != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: server.creds}
	}
	cmd.Env = append(os.Environ(), "LC_ALL=C")
	return cmd
}

func startServer() {
	server.bin = findBin()
	if server.bin == "" {
		server.skip = "no PostgreSQL server binary (initdb) here: install Debian's postgresql package to run the Postgres backend's tests (.ci/run does)"
		return
	}
	dir, err := os.MkdirTemp("", "retryindex-pg-")
	if err != nil {
		server.err = err
		return
	}
	server.dir = dir
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			server.err = fmt.Errorf("running as root needs the postgres user to start the server: %w", err)
			return
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		server.creds = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
		if err := os.Chown(dir, uid, gid); err != nil {
			server.err = err
			return
		}
	}
	data := filepath.Join(dir, "data")
	if out, err := command("initdb", "-D", data, "-U", "sbretry", "--auth=trust", "--no-sync", "-E", "UTF8").CombinedOutput(); err != nil {
		server.err = fmt.Errorf("initdb: %v: %s", err, out)
		return
	}
	opts := fmt.Sprintf("-k %s -c listen_addresses='' -c fsync=off -c max_connections=200", dir)
	if out, err := command("pg_ctl", "-D", data, "-o", opts, "-w", "-t", "60", "-l", filepath.Join(dir, "log"), "start").CombinedOutput(); err != nil {
		log, _ := os.ReadFile(filepath.Join(dir, "log"))
		server.err = fmt.Errorf("pg_ctl start: %v: %s\n%s", err, out, log)
		return
	}
	server.conn = fmt.Sprintf("host=%s user=sbretry dbname=postgres", dir)
}

// Stop stops the server, if one was started, and removes its directory. TestMain calls it.
func Stop() {
	if server.dir == "" {
		return
	}
	if server.conn != "" {
		_ = command("pg_ctl", "-D", filepath.Join(server.dir, "data"), "-m", "immediate", "-w", "stop").Run()
	}
	_ = os.RemoveAll(server.dir)
}

// Database creates a database for one test and returns its connection string (keyword form, no
// password), skipping the test when no server binary exists.
func Database(t *testing.T) string {
	t.Helper()
	return DatabaseTB(t)
}

// DatabaseTB is [Database] for a test or a benchmark.
func DatabaseTB(t testing.TB) string {
	t.Helper()
	server.once.Do(startServer)
	if server.skip != "" {
		t.Skip(server.skip)
	}
	if server.err != nil {
		t.Fatal(server.err)
	}
	name := fmt.Sprintf("t%d", server.created.Add(1))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, server.conn)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close(ctx) }()
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("host=%s user=sbretry dbname=%s", server.dir, name)
}
