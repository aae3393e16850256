package sbemu

import (
	"fmt"
	"strings"

	"github.com/Azure/go-amqp"
)

// CBS request fields (AMQP claims-based security draft, as used by the SDK
// in internal/cbs.go).
const (
	cbsOperationPutToken = "put-token"
	cbsTokenTypeSAS      = "servicebus.windows.net:sastoken"
)

// handlePutToken answers a "$cbs" request. Without StrictAuth every token
// is accepted (202) for an entity that exists; a token for a queue, topic
// or subscription that does not exist is answered 404, as Service Bus
// does: "Put token failed. status-code: 404, status-description: The
// messaging entity 'sb://…/providers' could not be found. To know more
// visit https://aka.ms/sbResourceMgrExceptions." (a user's report,
// github.com/Azure/azure-service-bus issue 451). The Go SDK maps a 404
// from $cbs to CodeNotFound (azservicebus v1.11.0 internal/errors.go,
// TransformError), which its live tests TestNewClientNewSenderNotFound
// and TestNewClientNewReceiverNotFound expect before any link attaches. With it, the token must be a shared access signature
// whose audience covers the request's name (the entity's address or a
// prefix of it, such as the namespace) signed with the configured key (401
// otherwise), and the named entity becomes attachable on this connection
// until the token expires (token_expiry.go). The token itself is never
// logged.
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
		tokenType, _ := req.ApplicationProperties["type"].(string)
		token, _ := req.Value.(string)
		if tokenType != cbsTokenTypeSAS {
			c.log.Info("sbemu: put-token refused", "audience", audience, "reason", "unsupported token type "+tokenType)
			return rpcReply(401, "sbemu: unsupported token type "+quote(tokenType), nil)
		}
		expiry, err := verifySAS(token, c.em.cfg.KeyName, c.em.cfg.Key, audience, c.em.cfg.Clock.Now())
		if err != nil {
			c.log.Info("sbemu: put-token refused", "audience", audience, "reason", err.Error())
			return rpcReply(401, err.Error(), nil)
		}
		c.authorize(path, expiry)
	}
	if entity, ok := c.missingEntity(path); ok {
		c.log.Info("sbemu: put-token refused", "audience", audience, "reason", "no such entity")
		return rpcReply(404, fmt.Sprintf("The messaging entity '%s' could not be found. To know more visit https://aka.ms/sbResourceMgrExceptions. sbemu: no queue, topic or subscription %q", audience, entity), nil)
	}
	c.log.Debug("sbemu: put-token accepted", "audience", audience)
	// The SDK's CBS client treats any 2xx status as success.
	return rpcReply(202, "Accepted", nil)
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
