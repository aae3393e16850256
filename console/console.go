package console

import (
	"bytes"
	"embed"
	"fmt"
	"html/template"
	"io/fs"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"

	"github.com/sbretry/retry/inspect"
	"github.com/sbretry/retry/internal/redact"
)

//go:embed templates/*.html
var templateFS embed.FS

//go:embed static
var staticFS embed.FS

// Console is the operations console: an [http.Handler] serving its pages and actions, and
// [Console.Run], which polls the entities for the overview's history. Create it with [New]; the zero
// value is not usable. It is safe for concurrent use; it holds no links between requests (every read
// and action opens and closes its own), so it needs no Close: close the client when done.
type Console struct {
	client   *azservicebus.Client
	entities []*entity
	byPath   map[string]*entity
	opts     Options
	handler  http.Handler
	tmpl     *template.Template
	secret   []byte
	ring     *ring
	audit    *auditLog
	now      func() time.Time
	polled   func() // test hook: after each poll of Run
}

// entity is one configured entity with its inspector.
type entity struct {
	cfg    Entity
	parsed inspect.Entity
	in     *inspect.Inspector
	target string // where a redrive sends
	// sessionIn reads the entity as a session entity (inspect.Options.SessionConsumer); session says
	// it is one: configured (Entity.SessionConsumer), or recognised from its refusal of a plain
	// receiver (see recognise).
	sessionIn *inspect.Inspector
	session   atomic.Bool
}

// New returns a console over entities through client. It does not contact Service Bus. Errors wrap
// [ErrInvalidOptions]: no client, no entities, an invalid or repeated entity, a subscription without
// its RetryQueue, invalid options.
func New(client *azservicebus.Client, entities []Entity, opts *Options) (*Console, error) {
	if client == nil {
		return nil, fmt.Errorf("%w: nil client", ErrInvalidOptions)
	}
	if len(entities) == 0 {
		return nil, fmt.Errorf("%w: no entities", ErrInvalidOptions)
	}
	o, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	c := &Console{client: client, opts: o, byPath: map[string]*entity{}, secret: newSecret(), now: time.Now}
	c.audit = &auditLog{logger: o.Logger, path: o.AuditFile}
	if c.audit.logger == nil {
		c.audit.logger = slog.Default()
	}
	if o.AuditFile != "" {
		// Opened for appending now, so that a path that cannot be written fails here and not at the
		// first action, which would then be refused.
		f, err := os.OpenFile(o.AuditFile, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
		if err != nil {
			return nil, fmt.Errorf("%w: AuditFile: %w", ErrInvalidOptions, err)
		}
		_ = f.Close()
	}
	for _, cfg := range entities {
		pe, target, err := cfg.validate()
		if err != nil {
			return nil, err
		}
		// Service Bus names are case-insensitive: "Orders" and "orders" are one entity, and the
		// console's ?e= lookups match them the same way.
		key := strings.ToLower(pe.Path())
		if c.byPath[key] != nil {
			return nil, fmt.Errorf("%w: entity %s given twice", ErrInvalidOptions, pe.Path())
		}
		cfg.Path = pe.Path()
		sessionIn, err := inspect.New(client, cfg.Path, &inspect.Options{MaxPeek: o.MaxPeek, SessionConsumer: true, WakeTo: cfg.WakeTo, Observer: o.Observer})
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrInvalidOptions, err)
		}
		in := sessionIn
		if !cfg.SessionConsumer {
			in, err = inspect.New(client, cfg.Path, &inspect.Options{MaxPeek: o.MaxPeek, RetryQueue: cfg.RetryQueue, Observer: o.Observer})
			if err != nil {
				return nil, fmt.Errorf("%w: %w", ErrInvalidOptions, err)
			}
		}
		e := &entity{cfg: cfg, parsed: pe, in: in, target: target, sessionIn: sessionIn}
		e.session.Store(cfg.SessionConsumer)
		c.entities = append(c.entities, e)
		c.byPath[key] = e
	}
	if o.IndexDedicated && (o.Index == nil || len(c.entities) != 1) {
		return nil, fmt.Errorf("%w: IndexDedicated needs an Index and exactly one entity (it has %d)", ErrInvalidOptions, len(c.entities))
	}
	// One sample per poll over the window, plus the one being replaced.
	c.ring = newRing(int(o.Window/o.PollInterval) + 1)
	c.tmpl, err = template.New("").Funcs(templateFuncs).ParseFS(templateFS, "templates/*.html")
	if err != nil {
		return nil, fmt.Errorf("console: templates: %w", err)
	}
	c.handler = c.routes()
	// The token check wraps everything, static files included: nothing about the namespace is served
	// to someone without it.
	tokens, err := validateTokens(o)
	if err != nil {
		return nil, err
	}
	if len(tokens) > 0 {
		c.handler = requireToken(newTokenSet(tokens), c.handler)
	} else {
		c.handler = allowedHostsOnly(o.AllowedHosts, c.handler)
	}
	return c, nil
}

// ServeHTTP serves the console's pages, actions and static files.
func (c *Console) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	securityHeaders(w.Header())
	c.handler.ServeHTTP(w, r)
}

// routes maps the console's paths. Reads are GET; the two action steps are POST only, which the mux
// enforces by method (anything else on them is a 405), so a link, an image or a prefetch can never
// change state.
func (c *Console) routes() http.Handler {
	mux := http.NewServeMux()
	static, _ := fs.Sub(staticFS, "static")
	mux.Handle("GET /static/", http.StripPrefix("/static/", noDirectories(http.FileServerFS(static))))
	mux.HandleFunc("GET /{$}", c.overview)
	mux.HandleFunc("GET /pending", c.pendingPage)
	mux.HandleFunc("GET /deadletters", c.deadLettersPage)
	mux.HandleFunc("GET /group", c.groupPage)
	mux.HandleFunc("GET /message", c.messagePage)
	mux.HandleFunc("GET /audit", c.auditHandler)
	mux.HandleFunc("GET /sessions", c.sessionsPage)
	mux.HandleFunc("GET /search", c.search)
	mux.HandleFunc("GET /api/series", c.seriesJSON)
	mux.HandleFunc("GET /api/timeline", c.timelineJSON)
	mux.HandleFunc("POST /action/preview", c.preview)
	mux.HandleFunc("POST /action/run", c.runAction)
	// Every other method on the action paths is refused by the mux with 405: state changes are POST.
	return mux
}

// page is what every template gets: the title, the CSRF token for its forms, the base every relative
// link resolves against, and the page's own data.
type page struct {
	Title string
	CSRF  string
	Base  string
	Data  any
	// Who and Role name the token the request presented (empty without tokens); CanAct says whether
	// it may act, and the pages show their action buttons only then.
	Who    string
	Role   string
	CanAct bool
	// Query is the search box's text: the search page's query, empty elsewhere.
	Query string
}

// basePath is the path the console is mounted at, with a trailing slash: "/" when it serves the root,
// "/ops/" under http.StripPrefix("/ops", c). Every link of the pages is relative to it (through the
// page's <base>), so the console works wherever a service mounts it. StripPrefix shortens r.URL.Path
// but leaves r.RequestURI as the client sent it; the difference is the prefix.
func basePath(r *http.Request) string {
	u, err := url.ParseRequestURI(r.RequestURI)
	if err != nil || !strings.HasSuffix(u.Path, r.URL.Path) {
		return "/"
	}
	return strings.TrimSuffix(u.Path[:len(u.Path)-len(r.URL.Path)], "/") + "/"
}

// render executes the named template into a buffer first, so that a failing template becomes a clean
// error page, not half a page.
func (c *Console) render(w http.ResponseWriter, r *http.Request, status int, name, title string, data any) {
	var buf bytes.Buffer
	pg := c.pageOf(w, r, title, data)
	if err := c.tmpl.ExecuteTemplate(&buf, name, pg); err != nil {
		http.Error(w, "sbretry console: rendering "+name+": "+redact.String(err.Error()), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	_, _ = w.Write(buf.Bytes())
}

// pageOf is what the templates get for a page of r with title and data.
func (c *Console) pageOf(w http.ResponseWriter, r *http.Request, title string, data any) page {
	p := principalOf(r)
	pg := page{Title: title, CSRF: c.csrfToken(w, r), Base: basePath(r), Data: data, Who: p.Name, CanAct: p.canAct()}
	if p.Name != "" {
		pg.Role = p.Role.String()
	}
	if sp, ok := data.(*searchPage); ok {
		pg.Query = sp.Query
	}
	return pg
}

// fail shows an error page with status and a message for people; the message is redacted.
func (c *Console) fail(w http.ResponseWriter, r *http.Request, status int, format string, args ...any) {
	c.render(w, r, status, "error.html", http.StatusText(status), shownText(fmt.Sprintf(format, args...)))
}

// entityOf returns the entity named by the query or form field "e", or writes a 400 or 404.
func (c *Console) entityOf(w http.ResponseWriter, r *http.Request) (*entity, bool) {
	name := r.FormValue("e")
	if name == "" {
		c.fail(w, r, http.StatusBadRequest, "no entity: add ?e=ENTITY (one of %s)", c.entityList())
		return nil, false
	}
	e := c.byPath[strings.ToLower(strings.TrimSuffix(name, "/"))]
	if e == nil {
		c.fail(w, r, http.StatusNotFound, "unknown entity %q: this console shows %s", name, c.entityList())
		return nil, false
	}
	return e, true
}

// entityList names the configured entities, for messages about an unknown one.
func (c *Console) entityList() string {
	names := make([]string, len(c.entities))
	for i, e := range c.entities {
		names[i] = e.cfg.Path
	}
	return strings.Join(names, ", ")
}

// intParam reads a non-negative integer query parameter; absent is def.
func intParam(r *http.Request, name string, def int) (int, error) {
	// maxIntParam keeps page × page size far from overflowing: no entity is read past MaxPeek anyway.
	s := r.FormValue(name)
	if s == "" {
		return def, nil
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 0 || n > maxIntParam {
		return 0, fmt.Errorf("%s=%q is not a number from 0 to %d", name, s, maxIntParam)
	}
	return n, nil
}

// maxIntParam is the largest number a query parameter may carry.
const maxIntParam = 1_000_000

// itoa is strconv.Itoa, short for messages.
func itoa(n int) string { return strconv.Itoa(n) }

// plural is "1 dead letter" or "3 dead letters".
func plural(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return strconv.Itoa(n) + " " + noun + "s"
}

// templateFuncs are the helpers the templates call: times in UTC (operators compare them across
// regions), any text a message carries redacted and made showable (text; textblock for a <pre>), plurals,
// and clipping of long errors in tables (the message page shows them whole).
var templateFuncs = template.FuncMap{
	"time": func(t time.Time) string {
		if t.IsZero() {
			return "—"
		}
		return t.UTC().Format("2006-01-02 15:04:05Z")
	},
	"text":      shownText,
	"errorText": errorText,
	"byText":    byText,
	"textblock": shownBlock,
	"plural":    plural,
	"plural64":  func(n int64, noun string) string { return plural(int(n), noun) },
	"int64":     func(n int) int64 { return int64(n) },
	"dict": func(kv ...any) map[string]any {
		m := make(map[string]any, len(kv)/2)
		for i := 0; i+1 < len(kv); i += 2 {
			m[kv[i].(string)] = kv[i+1]
		}
		return m
	},
	"clip": func(n int, s string) string {
		r := []rune(s)
		if len(r) <= n {
			return s
		}
		return string(r[:n-1]) + "…"
	},
}
