package sbemu

import (
	"net/http"
	"strings"
)

// authorize checks a request's Authorization header under
// [Config.StrictAuth], as the "$cbs" node checks a put-token, and returns
// the rights it grants: a SharedAccessSignature signed by a policy's key
// ([checkSAS]; the namespace's, or the addressed entity's own, rights.go),
// not expired, whose audience (sr) covers the request URL. Service Bus
// accepts a token for any prefix of the resource (a namespace token covers
// every entity), and so does the emulator. The SDK signs the full request
// URL (azservicebus v1.11.0 internal/atom/per_retry_auth_policy.go) and
// sends a token credential's JWT as the header's whole value, which
// [Config.AcceptUnverifiedJWT] accepts with every right. Without
// StrictAuth every request is accepted with every right, as on the AMQP
// side. Neither the token nor the key ever appears in an error or a log
// line.
func (a *adminServer) authorize(r *http.Request) (rights, error) {
	cfg := a.e.cfg
	if !cfg.StrictAuth {
		return allRights, nil
	}
	token := r.Header.Get("Authorization")
	if token == "" {
		return 0, apiErrorf(http.StatusUnauthorized, "sbemu: the request has no Authorization header")
	}
	if cfg.AcceptUnverifiedJWT && !strings.HasPrefix(token, sasPrefix) {
		return allRights, nil
	}
	path := strings.Trim(r.URL.Path, "/")
	_, granted, err := checkSAS(token, "https://"+r.Host+r.URL.Path, cfg.Clock.Now(), func(keyName string) (policy, bool) {
		return a.e.policyFor(keyName, path)
	})
	if err != nil {
		return 0, apiErrorf(http.StatusUnauthorized, "%v", err)
	}
	return granted, nil
}

// refuseWithoutManage answers a request whose token lacks Manage, which
// every operation of the administration API needs, the way Service Bus
// answers it (the SDK's live tests TestAdminClient_LackPermissions_Queue,
// _Topic and _Subscription, which use a key with Send and Listen only):
//
//   - reading a queue or topic, or listing them: 401 "Manage,EntityRead
//     claims required for this operation."; but reading one that does not
//     exist answers 404 first, so a missing entity still reads as missing;
//   - creating or updating one: 401 "Authorization failed for specified
//     action: Manage,EntityWrite.";
//   - deleting one: 401 "Authorization failed for specified action:
//     Manage,EntityDelete.";
//   - any operation on subscriptions and rules, whether they exist or not:
//     401 "401 SubCode=40100: Unauthorized : Unauthorized access for
//     'GetSubscription' operation on endpoint '…'." with the operation's
//     name (EnumerateSubscriptions, CreateOrUpdateSubscription,
//     DeleteSubscription, and the same for rules).
//
// It returns nil when the request should go on to its handler.
func (a *adminServer) refuseWithoutManage(r *http.Request, parts []string) error {
	const detail = " sbemu: the token's policy does not have Manage"
	if len(parts) >= 2 && strings.EqualFold(parts[1], "Subscriptions") {
		kind := "Subscription"
		if len(parts) >= 4 {
			kind = "Rule"
		}
		one := len(parts) == 3 || len(parts) == 5
		var op string
		switch {
		case r.Method == http.MethodGet && one:
			op = "Get" + kind
		case r.Method == http.MethodGet:
			op = "Enumerate" + kind + "s"
		case r.Method == http.MethodPut:
			op = "CreateOrUpdate" + kind
		default:
			op = "Delete" + kind
		}
		return apiErrorf(http.StatusUnauthorized, "401 SubCode=40100: Unauthorized : Unauthorized access for '%s' operation on endpoint '%s'.%s",
			op, "sb://"+r.Host+r.URL.Path, detail)
	}
	switch r.Method {
	case http.MethodGet, http.MethodHead:
		if len(parts) == 1 && !strings.HasPrefix(parts[0], "$") && !a.exists(parts[0]) {
			return nil // the handler answers 404
		}
		return apiErrorf(http.StatusUnauthorized, "Manage,EntityRead claims required for this operation.%s", detail)
	case http.MethodDelete:
		return apiErrorf(http.StatusUnauthorized, "Authorization failed for specified action: Manage,EntityDelete.%s", detail)
	}
	return apiErrorf(http.StatusUnauthorized, "Authorization failed for specified action: Manage,EntityWrite.%s", detail)
}
