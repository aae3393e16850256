package sbemu

import (
	"github.com/Azure/go-amqp"
)

// CBS request fields (AMQP claims-based security draft, as used by the SDK
// in internal/cbs.go).
const (
	cbsOperationPutToken = "put-token"
	cbsTokenTypeSAS      = "servicebus.windows.net:sastoken"
)

// handlePutToken answers a "$cbs" request. Without StrictAuth every token
// is accepted (202). With it, the token must be a shared access signature
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
	c.log.Debug("sbemu: put-token accepted", "audience", audience)
	// The SDK's CBS client treats any 2xx status as success.
	return rpcReply(202, "Accepted", nil)
}

// quote formats s for an error description.
func quote(s string) string { return "\"" + s + "\"" }
