package redact

import (
	"encoding/base64"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// redactCases pairs inputs with their exact redaction. They double as seeds for FuzzString.
var redactCases = []struct {
	name, in, want string
}{
	// Connection strings.
	{"service bus connection string",
		"Endpoint=sb://ns.servicebus.windows.net/;SharedAccessKeyName=RootManageSharedAccessKey;SharedAccessKey=abc123+/=;EntityPath=q",
		"Endpoint=sb://ns.servicebus.windows.net/;SharedAccessKeyName=RootManageSharedAccessKey;SharedAccessKey=REDACTED;EntityPath=q"},
	{"lower case key", "endpoint=sb://x/;sharedaccesskey=s3cr3t", "endpoint=sb://x/;sharedaccesskey=REDACTED"},
	{"key at end", "SharedAccessKey=topsecret", "SharedAccessKey=REDACTED"},
	{"colon after value stays", "SharedAccessKey=abc: refused", "SharedAccessKey=REDACTED: refused"},
	{"full stop at end stays", "bad SharedAccessKey=abc.", "bad SharedAccessKey=REDACTED."},
	{"full stop before space stays", "bad SharedAccessKey=abc. Retrying", "bad SharedAccessKey=REDACTED. Retrying"},
	{"dot inside a value is the value", "token=abc.def ok", "token=REDACTED ok"},
	{"spaces around equals", "SharedAccessKey = abc ;x", "SharedAccessKey = REDACTED ;x"},
	{"storage account key",
		"DefaultEndpointsProtocol=https;AccountName=acct;AccountKey=a1b2c3==;EndpointSuffix=core.windows.net",
		"DefaultEndpointsProtocol=https;AccountName=acct;AccountKey=REDACTED;EndpointSuffix=core.windows.net"},
	{"password", "Server=tcp:db,1433;User ID=u;Password=p@ss!word;Encrypt=true", "Server=tcp:db,1433;User ID=u;Password=REDACTED;Encrypt=true"},
	{"pwd in upper case", "Uid=u;PWD=s3cr3t;", "Uid=u;PWD=REDACTED;"},
	{"client secret", "ClientId=app;ClientSecret=abc~def;TenantId=t", "ClientId=app;ClientSecret=REDACTED;TenantId=t"},
	{"quoted value keeps its quotes", `Password="a;b c";Uid=u`, `Password="REDACTED";Uid=u`},
	{"unterminated quote", `Password="abc def`, `Password="REDACTED def`},
	{"empty value is left alone", "Password=;Uid=u", "Password=;Uid=u"},
	{"punctuation only is left alone", "Password=...", "Password=..."},

	// SAS tokens: only sig is secret.
	{"sas in connection string",
		"Endpoint=sb://x/;SharedAccessSignature=SharedAccessSignature sr=x&sig=zzzsig&se=1&skn=k",
		"Endpoint=sb://x/;SharedAccessSignature=SharedAccessSignature sr=x&sig=REDACTED&se=1&skn=k"},
	{"bare sas token",
		"token: SharedAccessSignature sr=amqp%3A%2F%2Fx&sig=Qm9vbQ%3D%3D&se=17&skn=Root",
		"token: SharedAccessSignature sr=amqp%3A%2F%2Fx&sig=REDACTED&se=17&skn=Root"},
	{"sas url", "GET https://a.blob.core.windows.net/c/b?sv=2022-11-02&sig=abc%2Bdef%3D&se=2030 failed",
		"GET https://a.blob.core.windows.net/c/b?sv=2022-11-02&sig=REDACTED&se=2030 failed"},

	// Query strings and form bodies.
	{"oauth fragment", "redirect #access_token=tok123&refresh_token=ref456&expires_in=3600",
		"redirect #access_token=REDACTED&refresh_token=REDACTED&expires_in=3600"},
	{"form body", "client_id=app&client_secret=s3cr3t&grant_type=client_credentials",
		"client_id=app&client_secret=REDACTED&grant_type=client_credentials"},
	{"comma ends a value", "token=abc, retrying", "token=REDACTED, retrying"},
	{"closing bracket stays", "(token=abc)", "(token=REDACTED)"},
	{"escaped line break stays", `"Password=abc\n"`, `"Password=REDACTED\n"`},
	{"several secrets", "Password=a Pwd=b apikey=c api_key=d id_token=e", "Password=REDACTED Pwd=REDACTED apikey=REDACTED api_key=REDACTED id_token=REDACTED"},

	// JSON-ish maps.
	{"json", `{"token_type":"Bearer","access_token":"abc123","expires_in":3599}`,
		`{"token_type":"Bearer","access_token":"REDACTED","expires_in":3599}`},
	{"json with spaces", `{"password" : "p a s s"}`, `{"password" : "REDACTED"}`},
	{"json escaped quote", `{"password":"a\"b","x":1}`, `{"password":"REDACTED","x":1}`},
	{"json number", `{"token": 12345}`, `{"token": REDACTED}`},
	{"json quoted in a string", `body: "{\"client_secret\":\"a\\b\"}"`, `body: "{\"client_secret\":\"REDACTED\"}"`},
	{"python dict", `{'password': 'hunter2'}`, `{'password': 'REDACTED'}`},
	{"go quoted", `connect "SharedAccessKey=quoted1" failed`, `connect "SharedAccessKey=REDACTED" failed`},

	// Bearer and Authorization.
	{"authorization bearer", "Authorization: Bearer abc.def-ghi~", "Authorization: Bearer REDACTED"},
	{"authorization bearer plain word", "Authorization: Bearer token", "Authorization: Bearer REDACTED"},
	{"authorization basic", "Authorization: Basic dXNlcjpwYXNz", "Authorization: Basic REDACTED"},
	{"authorization json", `{"Authorization":"Bearer abc123"}`, `{"Authorization":"Bearer REDACTED"}`},
	{"bare bearer", "request failed with bearer 0123abcd: 401", "request failed with bearer REDACTED: 401"},
	{"bearer at end of sentence", "sent Bearer abc/def+ghi==.", "sent Bearer REDACTED."},
	{"long letters-only bearer", "Bearer abcdefghijklmnopqrstuvwxyz", "Bearer REDACTED"},
	{"bearer jwt", "Bearer eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.c2lnbmF0dXJl", "Bearer REDACTED"},

	// JWTs anywhere.
	{"jwt", "id eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.sig_-x. Next", "id REDACTED. Next"},
	{"jwe", "got eyJhbGciOiJkaXIifQ..aXY.Y3Q.dGFn", "got REDACTED"},
	{"jwt in key", "id_token=eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.c2ln;", "id_token=REDACTED;"},

	// Text that must not change.
	{"plain message", "nothing secret here", "nothing secret here"},
	{"network error", "dial tcp 10.0.0.1:5671: connect: connection refused", "dial tcp 10.0.0.1:5671: connect: connection refused"},
	{"token as a word", "the token expired; refresh it", "the token expired; refresh it"},
	{"token with colon", "token: missing", "token: missing"},
	{"password with colon", "invalid password: too short", "invalid password: too short"},
	{"key name only", "SharedAccessKeyName=RootManageSharedAccessKey", "SharedAccessKeyName=RootManageSharedAccessKey"},
	{"longer key", "tokens=3 signature=abc", "tokens=3 signature=abc"},
	{"key inside a word", "next_token=abc pageToken=def", "next_token=abc pageToken=def"},
	{"bearer in prose", "failed to acquire a bearer token", "failed to acquire a bearer token"},
	{"bearer capitalised prose", "Bearer Authentication failed", "Bearer Authentication failed"},
	{"json token type", `{"token_type":"Bearer"}`, `{"token_type":"Bearer"}`},
	{"eyJ inside a word", "loading surveyJS.min.js.map", "loading surveyJS.min.js.map"},
	{"lone jwt header", "header eyJhbGciOiJIUzI1NiJ9 only", "header eyJhbGciOiJIUzI1NiJ9 only"},
	{"already redacted", "SharedAccessKey=REDACTED; Bearer REDACTED", "SharedAccessKey=REDACTED; Bearer REDACTED"},
	{"empty", "", ""},
}

func TestString(t *testing.T) {
	for _, tc := range redactCases {
		t.Run(tc.name, func(t *testing.T) {
			got := String(tc.in)
			assert.Equal(t, tc.want, got)
			assert.Equal(t, got, String(got), "idempotent")
		})
	}
}

// TestStringEveryKey checks each key in each letter case and form, which also proves that the fast
// path in triggerAt knows every key the pattern does.
func TestStringEveryKey(t *testing.T) {
	forms := []struct{ name, in, want string }{
		{"connection string", "A=1;%s=v4lue;B=2", "A=1;%s=REDACTED;B=2"},
		{"query string", "/p?a=1&%s=v4lue&b=2", "/p?a=1&%s=REDACTED&b=2"},
		{"json", `{"%s":"v4lue"}`, `{"%s":"REDACTED"}`},
	}
	for _, key := range secretKeys {
		for _, spelling := range []string{key, strings.ToLower(key), strings.ToUpper(key)} {
			for _, form := range forms {
				t.Run(spelling+"/"+form.name, func(t *testing.T) {
					in := strings.ReplaceAll(form.in, "%s", spelling)
					assert.Equal(t, strings.ReplaceAll(form.want, "%s", spelling), String(in))
				})
			}
		}
	}
}

// FuzzString checks, for any text: no panic, idempotence, and that a SharedAccessKey or a JWT planted
// in it never survives. The planted secrets are bracketed by marker strings that cannot arise from
// REDACTED, so finding a marker in the output means part of a secret leaked.
func FuzzString(f *testing.F) {
	for _, tc := range redactCases {
		f.Add(tc.in, "", []byte(tc.name))
	}
	f.Add(`"password":"`, `"`, []byte{0xfb, 0xff})
	f.Add(`token=x\`, "", []byte("key"))
	f.Add("Bearer", "eyJ", []byte{0})
	f.Fuzz(func(t *testing.T, prefix, suffix string, secret []byte) {
		text := prefix + suffix
		once := String(text)
		require.Equal(t, once, String(once), "idempotent")

		const head, tail = "Zq9", "Wx7"
		if strings.Contains(text, head) || strings.Contains(text, tail) {
			return // the markers would not prove anything
		}
		key := head + base64.StdEncoding.EncodeToString(secret) + tail
		planted := prefix + ";SharedAccessKey=" + key + ";" + suffix
		out := String(planted)
		assert.NotContains(t, out, head, "SharedAccessKey value leaked")
		assert.NotContains(t, out, tail, "SharedAccessKey value leaked")
		require.Equal(t, out, String(out), "idempotent")

		third := len(secret) / 3
		segment := func(b []byte) string { return base64.RawURLEncoding.EncodeToString(b) + "A" }
		jwt := "eyJ" + head + segment(secret[:third]) + "." + segment(secret[third:2*third]) + "." + segment(secret[2*third:]) + tail
		planted = prefix + " " + jwt + " " + suffix
		out = String(planted)
		assert.NotContains(t, out, head, "JWT leaked")
		assert.NotContains(t, out, tail, "JWT leaked")
		require.Equal(t, out, String(out), "idempotent")
	})
}

func BenchmarkString(b *testing.B) {
	cases := []struct{ name, in string }{
		{"no secret", "retry: handler failed: dial tcp 10.0.0.1:5671: connect: connection refused (attempt 3 of 10)"},
		{"connection string", "retry: creating client: Endpoint=sb://ns.servicebus.windows.net/;SharedAccessKeyName=RootManageSharedAccessKey;SharedAccessKey=c2VjcmV0c2VjcmV0c2VjcmV0c2VjcmV0c2VjcmV0MTI=;EntityPath=orders: invalid"},
	}
	for _, bc := range cases {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				_ = String(bc.in)
			}
		})
	}
}
