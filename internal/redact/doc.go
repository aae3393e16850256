// Package redact removes secrets from text before it reaches a log line, an error or a broker
// property.
//
// Connection strings, SAS tokens and OAuth tokens end up in error messages more often than anyone
// intends: the SDK echoes a malformed connection string, a proxy error quotes a request URL, an
// identity library includes a token response. [String] scrubs such text and [Wrap] scrubs an error
// while keeping the original reachable for [errors.Is] and [errors.As].
//
// # What is recognised
//
//   - key=value pairs whose key names a secret, in any letter case: Password, Pwd, AccountKey,
//     SharedAccessKey, ClientSecret, client_secret, access_token, refresh_token, id_token, token,
//     api_key, apikey and sig. They are found in connection strings ("…;AccountKey=…;"), query
//     strings ("?sig=…&se=…"), and JSON or Python-style maps ("password":"…", 'token': '…'),
//     including JSON that was itself quoted into a string (\"password\":\"…\").
//   - SAS tokens ("SharedAccessSignature sr=…&sig=…&se=…&skn=…"): only sig is secret, so the
//     audience, expiry and key name stay readable for troubleshooting.
//   - Bearer tokens ("Bearer …", and "Authorization: Bearer …" or "Authorization: Basic …").
//   - JSON Web Tokens anywhere: three or more base64url segments, the first starting "eyJ".
//
// # What is kept
//
// Only the secret value becomes REDACTED; key names, separators, quotes and the rest of the message
// are left as they were, so "SharedAccessKey=abc: refused" becomes "SharedAccessKey=REDACTED:
// refused". An unquoted value ends at ';', '&', ',', a quote or white space, and trailing '.', ':',
// closing brackets or \n-style escapes are treated as the sentence around it rather than the secret.
// A quoted value ends at its closing quote.
//
// Applying [String] twice gives the same result as applying it once, so text may be redacted at
// every layer it passes through.
//
// # Limits
//
// Redaction is pattern matching, not a guarantee. A secret under an unknown key name, or a password
// that contains one of the separators above, is only partly hidden. To keep ordinary prose intact,
// "Bearer" followed by a short plain word ("bearer token") is left alone except in an Authorization
// header. Text with none of the key names, "Bearer", "Authorization" or "eyJ" in it is returned
// without running a regular expression, which keeps the common case cheap.
package redact
