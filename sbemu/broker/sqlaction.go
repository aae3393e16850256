package broker

import (
	"fmt"
	"strings"

	"github.com/Azure/go-amqp"
)

// Rule actions: "SET <property> = <expression>" and "REMOVE <property>",
// several, each optionally followed by ';'. Expressions are those of SQL filters and see
// the message as it was before the action started. SET on a system property
// is supported for the string properties a filter can read (sys.Label,
// sys.To, sys.ReplyTo, sys.ContentType, sys.CorrelationId, sys.MessageId,
// sys.SessionId, sys.ReplyToSessionId); REMOVE only on user properties.

// ruleStatement is one SET or REMOVE of an action.
type ruleStatement struct {
	remove bool
	prop   propertyNode
	value  sqlNode // SET only
}

// settableSystem lists the system properties a SET may assign.
var settableSystem = map[string]bool{
	"label": true, "subject": true, "to": true, "replyto": true, "contenttype": true,
	"correlationid": true, "messageid": true, "sessionid": true, "replytosessionid": true,
}

// parseSQLAction parses an action with the filter parser's lexer and
// expression grammar; a malformed action fails configuration like a
// malformed filter.
func parseSQLAction(s string) ([]ruleStatement, error) { return parseSQLActionWith(s, nil) }

// parseSQLActionWith is parseSQLAction for an action whose @parameters
// have the values in params ([RuleConfig.SQLActionParameters]).
func parseSQLActionWith(s string, params map[string]any) ([]ruleStatement, error) {
	p, err := newSQLParser(s, params)
	if err != nil {
		return nil, err
	}
	var out []ruleStatement
	for {
		for p.isOp(";") {
			p.next()
		}
		if p.peek().kind == tokEOF {
			break
		}
		switch {
		case p.isKeyword("SET"):
			p.next()
			prop, err := p.parseProperty()
			if err != nil {
				return nil, err
			}
			if prop.system && !settableSystem[prop.name] {
				return nil, p.errorf(p.peek(), "sys.%s cannot be SET by the emulator", prop.name)
			}
			if err := p.expectOp("="); err != nil {
				return nil, err
			}
			v, err := p.parseAdditive()
			if err != nil {
				return nil, err
			}
			out = append(out, ruleStatement{prop: prop, value: v})
		case p.isKeyword("REMOVE"):
			p.next()
			prop, err := p.parseProperty()
			if err != nil {
				return nil, err
			}
			if prop.system {
				return nil, p.errorf(p.peek(), "system property sys.%s cannot be removed", prop.name)
			}
			out = append(out, ruleStatement{remove: true, prop: prop})
		default:
			return nil, p.errorf(p.peek(), "expected SET or REMOVE, got %s", p.peek())
		}
		// The ';' after a statement is optional ("<statement> ::= <action>
		// [;]", learn.microsoft.com/azure/service-bus-messaging/
		// service-bus-messaging-sql-rule-action; the SDK's live test
		// TestAdminClient_CreateRules writes "SET a=@x SET b=@y").
		if t := p.peek(); t.kind != tokEOF && !(t.kind == tokOp && t.text == ";") && !p.isKeyword("SET") && !p.isKeyword("REMOVE") {
			return nil, p.errorf(t, "expected ';' or the next statement, got %s", t)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%w: empty action", ErrInvalidFilter)
	}
	return out, nil
}

// applyAction runs the statements on c (a copy). Values are computed
// against the original properties first, so statements do not see each
// other's effects.
func applyAction(stmts []ruleStatement, c *amqp.Message, size int) {
	src := messageProperties{m: CopyMessage(c), size: size}
	for _, st := range stmts {
		if st.remove {
			for k := range c.ApplicationProperties {
				if strings.EqualFold(k, st.prop.name) {
					delete(c.ApplicationProperties, k)
				}
			}
			continue
		}
		v := st.value.eval(src)
		if st.prop.system {
			setSystemProperty(c, st.prop.name, v)
			continue
		}
		if c.ApplicationProperties == nil {
			c.ApplicationProperties = map[string]any{}
		}
		// Keep the spelling the message already uses for the property.
		key := st.prop.name
		for k := range c.ApplicationProperties {
			if strings.EqualFold(k, key) {
				key = k
				break
			}
		}
		if v == nil {
			delete(c.ApplicationProperties, key)
			continue
		}
		c.ApplicationProperties[key] = v
	}
}

// setSystemProperty assigns one of settableSystem; a non-string value is
// stored in its string form, nil clears the property.
func setSystemProperty(m *amqp.Message, name string, v any) {
	if m.Properties == nil {
		m.Properties = &amqp.MessageProperties{}
	}
	var sp *string
	if v != nil {
		s := fmt.Sprint(v)
		sp = &s
	}
	p := m.Properties
	switch name {
	case "label", "subject":
		p.Subject = sp
	case "to":
		p.To = sp
	case "replyto":
		p.ReplyTo = sp
	case "contenttype":
		p.ContentType = sp
	case "sessionid":
		p.GroupID = sp
	case "replytosessionid":
		p.ReplyToGroupID = sp
	case "correlationid":
		if sp == nil {
			p.CorrelationID = nil
		} else {
			p.CorrelationID = *sp
		}
	case "messageid":
		if sp == nil {
			p.MessageID = nil
		} else {
			p.MessageID = *sp
		}
	}
}
