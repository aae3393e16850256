package sbemu

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/Azure/go-amqp"
)

// CBS request fields (AMQP claims-based security draft, as used by the SDK
// in internal/cbs.go) and the token types it sends: a shared access
// signature, or a JWT from an azcore.TokenCredential (Entra ID).
const (
	cbsOperationPutToken = "put-token"
	cbsTokenTypeSAS      = "servicebus.windows.net:sastoken"
	cbsTokenTypeJWT      = "jwt"
)

// handlePutToken answers a "$cbs" request.
//
// Without StrictAuth every token is accepted (202). With it, a shared
// access signature must be signed by a policy's key ([checkSAS], rights.go)
// for an audience that covers the request's name (the entity's address or
// a prefix of it, such as the namespace), and not have expired (401
// otherwise, an expired one described as Service Bus describes it, which
// the SDK's live tests check); a JWT is accepted only with
// [Config.AcceptUnverifiedJWT]. The named entity then becomes attachable
// on this connection, with the policy's rights, until the token expires
// (token_expiry.go). The token itself is never logged.
//
// Either way, a token for a queue, topic or subscription that does not
// exist is answered 404, as Service Bus does: "Put token failed.
// status-code: 404, status-description: The messaging entity
// 'sb://…/providers' could not be found. To know more visit
// https://aka.ms/sbResourceMgrExceptions." (a user's report,
// github.com/Azure/azure-service-bus issue 451). The Go SDK maps a 404
// from $cbs to CodeNotFound (azservicebus v1.11.0 internal/errors.go,
// TransformError), which its live tests TestNewClientNewSenderNotFound
// and TestNewClientNewReceiverNotFound expect before any link attaches.
func (c *conn) handlePutToken(req *amqp.Message) *amqp.Message {
	op, _ := req.ApplicationProperties["operation"].(string)
	if op != cbsOperationPutToken {
		return rpcReply(501, "sbemu: unsupported $cbs operation "+quote(op), nil)
	}
	// The SDK sends "name" as "amqp://host:port/<entity>"; entityPath keeps
	// only the entity so it matches link addresses.
	audience, _ := req.ApplicationProperties["name"].(string)
	path := entityPath(audience)
	if c.em.cfg.StrictAuth {
		expiry, granted, err := c.checkToken(req, audience, path)
		if err != nil {
			c.log.Info("sbemu: put-token refused", "audience", audience, "reason", err.Error())
			return rpcReply(401, err.Error(), nil)
		}
		c.authorize(path, expiry, granted)
	}
	if entity, ok := c.missingEntity(path); ok {
		c.log.Info("sbemu: put-token refused", "audience", audience, "reason", "no such entity")
		return rpcReply(404, fmt.Sprintf("The messaging entity '%s' could not be found. To know more visit https://aka.ms/sbResourceMgrExceptions. sbemu: no queue, topic or subscription %q", audience, entity), nil)
	}
	c.log.Debug("sbemu: put-token accepted", "audience", audience)
	// The SDK's CBS client treats any 2xx status as success.
	return rpcReply(202, "Accepted", nil)
}

// checkToken checks a put-token's token under StrictAuth and returns when
// it expires and the rights it grants for path.
func (c *conn) checkToken(req *amqp.Message, audience, path string) (time.Time, rights, error) {
	tokenType, _ := req.ApplicationProperties["type"].(string)
	token, _ := req.Value.(string)
	now := c.em.cfg.Clock.Now()
	switch {
	case tokenType == cbsTokenTypeSAS:
		return checkSAS(token, audience, now, func(keyName string) (policy, bool) { return c.em.policyFor(keyName, path) })
	case tokenType == cbsTokenTypeJWT && c.em.cfg.AcceptUnverifiedJWT:
		expiry := jwtExpiry(req.ApplicationProperties["expiration"], now)
		if !now.Before(expiry) {
			return time.Time{}, 0, fmt.Errorf("%s. sbemu: the JWT has expired", expiredToken(expiry))
		}
		return expiry, allRights, nil
	}
	return time.Time{}, 0, fmt.Errorf("sbemu: unsupported token type %s", quote(tokenType))
}

// jwtExpiry reads the expiry a client names for a JWT in the put-token's
// "expiration": the Go SDK sends Unix seconds as a string
// (internal/sbauth/token_provider.go), other clients a timestamp. Without
// one the token is good for an hour, the lifetime of an Entra ID token.
func jwtExpiry(v any, now time.Time) time.Time {
	switch e := v.(type) {
	case string:
		if unix, err := strconv.ParseInt(e, 10, 64); err == nil {
			return time.Unix(unix, 0)
		}
	case time.Time:
		return e
	case int64:
		return time.Unix(e, 0)
	}
	return now.Add(time.Hour)
}

// missingEntity reports the entity a put-token names when it does not
// exist: path is the token's audience reduced to an entity path, possibly
// with "/$management" after it. A token for the namespace itself (an
// empty path) names no entity.
func (c *conn) missingEntity(path string) (string, bool) {
	entity := strings.TrimSuffix(path, "/")
	if n := len(entity) - len(managementSuffix); n >= 0 && strings.EqualFold(entity[n:], managementSuffix) {
		entity = entity[:n]
	}
	if entity == "" {
		return "", false
	}
	if _, ok := c.em.broker.Queue(entity); ok {
		return "", false
	}
	return entity, true
}

// quote formats s for an error description.
func quote(s string) string { return "\"" + s + "\"" }
