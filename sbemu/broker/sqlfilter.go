package broker

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"unicode"
)

// This file implements the SQL filter language of subscription rules, the
// subset Microsoft documents at
// https://learn.microsoft.com/azure/service-bus-messaging/service-bus-messaging-sql-filter
// (a subset of SQL-92): comparisons (= <> != > >= < <=), AND, OR, NOT, IN,
// LIKE with ESCAPE, IS [NOT] NULL, EXISTS, arithmetic (+ - * / %), the sys.
// and user. scopes (user. is the default), regular, [delimited] and "quoted"
// identifiers, string, integer, decimal, scientific, TRUE, FALSE and NULL
// constants, and @parameters, whose values the rule supplies
// ([RuleConfig.SQLFilterParameters]; an expression naming a parameter the
// rule does not define is refused, as Service Bus refuses it). The
// functions newid() and property() are not supported and are refused when
// the rule is configured.
//
// Evaluation follows the documented semantics: property names are
// case-insensitive; a missing user property is "unknown", which propagates
// through operators and the three-valued AND/OR tables, and a filter
// matches only when it evaluates to true. String comparison is ordinal
// (case-sensitive), as C# string equality is.

// ErrInvalidFilter wraps every error in a SQL filter or action expression.
// [New] reports it (inside [ErrInvalidConfig]) naming the rule, so a typo
// in a filter fails when the broker is configured, not silently at send time.
var ErrInvalidFilter = errors.New("broker: invalid SQL filter")

// sqlNode is one node of a parsed expression. eval returns the value: nil
// for unknown (and NULL), or an int64, float64, string or bool.
type sqlNode interface {
	eval(p propertySource) any
}

// propertySource resolves property references for evaluation.
type propertySource interface {
	// system returns a system property by its lower-case name; ok is false
	// when the message does not carry it (it is unknown, then).
	system(name string) (any, bool)
	// user returns an application property, case-insensitively.
	user(name string) (any, bool)
}

// parseSQLFilter parses a filter expression without parameters; see
// [parseSQLFilterWith].
func parseSQLFilter(expr string) (sqlNode, error) { return parseSQLFilterWith(expr, nil) }

// parseSQLFilterWith parses a filter expression whose @parameters have the
// values in params. The whole input must be one predicate; an error names
// the offending position.
func parseSQLFilterWith(expr string, params map[string]any) (sqlNode, error) {
	p, err := newSQLParser(expr, params)
	if err != nil {
		return nil, err
	}
	n, err := p.parseOr()
	if err != nil {
		return nil, err
	}
	if t := p.peek(); t.kind != tokEOF {
		return nil, p.errorf(t, "unexpected %s after the end of the expression", t)
	}
	return n, nil
}

// matchSQL evaluates a parsed filter: only true matches.
func matchSQL(n sqlNode, p propertySource) bool {
	v, ok := n.eval(p).(bool)
	return ok && v
}

// --- lexer ---
//
// The lexer turns the expression into tokens first, so the parser never
// deals with quoting or whitespace. It works on runes because identifiers
// may be any Unicode letters (the documented [[:IsLetter:]] class), and
// positions in errors are rune offsets a user can count in the text.

// tokKind classifies a token.
type tokKind int

const (
	tokEOF tokKind = iota
	tokIdent
	tokKeyword
	tokString
	tokInt
	tokFloat
	tokOp
	tokParam // @name; text is the name with its @
)

// sqlToken is one lexed token. Numbers are converted while lexing, so an
// integer out of the 64-bit range (Service Bus stores integer constants as
// Int64) is reported at its position.
type sqlToken struct {
	kind tokKind
	text string // identifier (unquoted), keyword (upper case), operator, or string contents
	pos  int
	i    int64
	f    float64
}

// String renders a token for error messages.
func (t sqlToken) String() string {
	switch t.kind {
	case tokEOF:
		return "end of expression"
	case tokString:
		return strconv.Quote(t.text)
	}
	return fmt.Sprintf("%q", t.text)
}

// sqlKeywords are reserved words; they cannot be regular identifiers.
var sqlKeywords = map[string]bool{
	"AND": true, "OR": true, "NOT": true, "IN": true, "LIKE": true, "ESCAPE": true,
	"IS": true, "NULL": true, "EXISTS": true, "TRUE": true, "FALSE": true,
	"SET": true, "REMOVE": true,
}

// maxSQLLength bounds an expression; filters come from configuration, but
// the parser is recursive and should never be handed something unbounded.
const maxSQLLength = 64 * 1024

// maxSQLDepth bounds nesting (parentheses, NOT chains, unary signs).
const maxSQLDepth = 200

// lexSQL splits s into tokens ending with a tokEOF. Keywords are matched
// case-insensitively (SQL's rule) and stored upper case; quoted identifiers
// ("..." and [...]) and string constants ('...') undouble their closing
// character, as the filter grammar specifies.
func lexSQL(s string) ([]sqlToken, error) {
	if len(s) > maxSQLLength {
		return nil, fmt.Errorf("%w: expression of %d bytes exceeds %d", ErrInvalidFilter, len(s), maxSQLLength)
	}
	var toks []sqlToken
	rs := []rune(s)
	for i := 0; i < len(rs); {
		r := rs[i]
		switch {
		case unicode.IsSpace(r):
			i++
		case unicode.IsLetter(r):
			j := i + 1
			for j < len(rs) && (rs[j] == '_' || unicode.IsLetter(rs[j]) || unicode.IsDigit(rs[j])) {
				j++
			}
			word := string(rs[i:j])
			if up := strings.ToUpper(word); sqlKeywords[up] {
				toks = append(toks, sqlToken{kind: tokKeyword, text: up, pos: i})
			} else {
				toks = append(toks, sqlToken{kind: tokIdent, text: word, pos: i})
			}
			i = j
		case r == '@' && i+1 < len(rs) && (rs[i+1] == '_' || unicode.IsLetter(rs[i+1])):
			j := i + 1
			for j < len(rs) && (rs[j] == '_' || unicode.IsLetter(rs[j]) || unicode.IsDigit(rs[j])) {
				j++
			}
			toks = append(toks, sqlToken{kind: tokParam, text: string(rs[i:j]), pos: i})
			i = j
		case r == '[' || r == '"' || r == '\'':
			closing := r
			if r == '[' {
				closing = ']'
			}
			var b strings.Builder
			j := i + 1
			for {
				if j >= len(rs) {
					return nil, fmt.Errorf("%w: unterminated %c at position %d", ErrInvalidFilter, r, i)
				}
				if rs[j] == closing {
					// A doubled closing character stands for itself.
					if j+1 < len(rs) && rs[j+1] == closing {
						b.WriteRune(closing)
						j += 2
						continue
					}
					break
				}
				b.WriteRune(rs[j])
				j++
			}
			kind := tokIdent
			if r == '\'' {
				kind = tokString
			}
			toks = append(toks, sqlToken{kind: kind, text: b.String(), pos: i})
			i = j + 1
		case unicode.IsDigit(r) || (r == '.' && i+1 < len(rs) && unicode.IsDigit(rs[i+1])):
			j := i
			isFloat := false
			for j < len(rs) && unicode.IsDigit(rs[j]) {
				j++
			}
			if j < len(rs) && rs[j] == '.' {
				isFloat = true
				j++
				for j < len(rs) && unicode.IsDigit(rs[j]) {
					j++
				}
			}
			if j < len(rs) && (rs[j] == 'e' || rs[j] == 'E') {
				k := j + 1
				if k < len(rs) && (rs[k] == '+' || rs[k] == '-') {
					k++
				}
				if k < len(rs) && unicode.IsDigit(rs[k]) {
					isFloat = true
					for j = k; j < len(rs) && unicode.IsDigit(rs[j]); j++ {
					}
				}
			}
			text := string(rs[i:j])
			t := sqlToken{kind: tokInt, text: text, pos: i}
			if isFloat {
				f, err := strconv.ParseFloat(text, 64)
				if err != nil {
					return nil, fmt.Errorf("%w: bad number %q at position %d", ErrInvalidFilter, text, i)
				}
				t.kind, t.f = tokFloat, f
			} else {
				n, err := strconv.ParseInt(text, 10, 64)
				if err != nil {
					return nil, fmt.Errorf("%w: integer %q at position %d is out of the 64-bit range", ErrInvalidFilter, text, i)
				}
				t.i = n
			}
			toks = append(toks, t)
			i = j
		default:
			op := string(r)
			if i+1 < len(rs) {
				switch two := string(rs[i : i+2]); two {
				case "<>", "!=", ">=", "<=":
					op = two
				}
			}
			switch op {
			case "=", "<>", "!=", ">", ">=", "<", "<=", "+", "-", "*", "/", "%", "(", ")", ",", ".", ";":
			default:
				return nil, fmt.Errorf("%w: unexpected character %q at position %d", ErrInvalidFilter, r, i)
			}
			toks = append(toks, sqlToken{kind: tokOp, text: op, pos: i})
			i += len([]rune(op))
		}
	}
	return append(toks, sqlToken{kind: tokEOF, pos: len(rs)}), nil
}

// --- parser ---
//
// A recursive-descent parser, one function per precedence level from the
// loosest: OR, AND, NOT, predicates (comparison, IN, LIKE, IS NULL,
// EXISTS), then + and -, then * / %, unary signs and primaries. That is
// SQL-92's precedence, so "a = 1 OR b = 2 AND c = 3" groups the AND first.

// sqlParser walks the token list; depth counts nested constructs so that a
// hostile expression cannot overflow the stack.
type sqlParser struct {
	toks   []sqlToken
	at     int
	depth  int
	params map[string]any // by lower-case name with its @
}

// newSQLParser lexes s and positions the parser on its first token;
// params are the values of its @parameters, named with or without the @
// and matched ignoring case.
func newSQLParser(s string, params map[string]any) (*sqlParser, error) {
	toks, err := lexSQL(s)
	if err != nil {
		return nil, err
	}
	p := &sqlParser{toks: toks}
	if len(params) > 0 {
		p.params = make(map[string]any, len(params))
		for k, v := range params {
			p.params["@"+strings.ToLower(strings.TrimPrefix(k, "@"))] = v
		}
	}
	return p, nil
}

// peek returns the current token without consuming it.
func (p *sqlParser) peek() sqlToken { return p.toks[p.at] }

// next consumes and returns the current token; at the end it keeps
// returning tokEOF, so callers need no bounds checks.
func (p *sqlParser) next() sqlToken {
	t := p.toks[p.at]
	if t.kind != tokEOF {
		p.at++
	}
	return t
}

// errorf builds an [ErrInvalidFilter] error pointing at t.
func (p *sqlParser) errorf(t sqlToken, format string, args ...any) error {
	return fmt.Errorf("%w: %s at position %d", ErrInvalidFilter, fmt.Sprintf(format, args...), t.pos)
}

// isKeyword and isOp test the current token without consuming it.
func (p *sqlParser) isKeyword(word string) bool {
	t := p.peek()
	return t.kind == tokKeyword && t.text == word
}

func (p *sqlParser) isOp(op string) bool {
	t := p.peek()
	return t.kind == tokOp && t.text == op
}

// expectOp consumes the operator op or fails naming what was found.
func (p *sqlParser) expectOp(op string) error {
	if t := p.next(); t.kind != tokOp || t.text != op {
		return p.errorf(t, "expected %q, got %s", op, t)
	}
	return nil
}

// enter bounds recursion so a hostile expression cannot exhaust the stack.
func (p *sqlParser) enter() error {
	p.depth++
	if p.depth > maxSQLDepth {
		return p.errorf(p.peek(), "expression nested deeper than %d", maxSQLDepth)
	}
	return nil
}

// leave undoes enter.
func (p *sqlParser) leave() { p.depth-- }

// parseOr parses predicates joined by OR (left-associative).
func (p *sqlParser) parseOr() (sqlNode, error) {
	left, err := p.parseAnd()
	if err != nil {
		return nil, err
	}
	for p.isKeyword("OR") {
		p.next()
		right, err := p.parseAnd()
		if err != nil {
			return nil, err
		}
		left = orNode{left, right}
	}
	return left, nil
}

// parseAnd parses predicates joined by AND, which binds tighter than OR.
func (p *sqlParser) parseAnd() (sqlNode, error) {
	left, err := p.parseNot()
	if err != nil {
		return nil, err
	}
	for p.isKeyword("AND") {
		p.next()
		right, err := p.parseNot()
		if err != nil {
			return nil, err
		}
		left = andNode{left, right}
	}
	return left, nil
}

// parseNot parses any number of leading NOTs before a predicate.
func (p *sqlParser) parseNot() (sqlNode, error) {
	if p.isKeyword("NOT") {
		if err := p.enter(); err != nil {
			return nil, err
		}
		defer p.leave()
		p.next()
		inner, err := p.parseNot()
		if err != nil {
			return nil, err
		}
		return notNode{inner}, nil
	}
	return p.parsePredicate()
}

// parsePredicate parses EXISTS, or an expression optionally followed by a
// comparison, [NOT] IN, [NOT] LIKE or IS [NOT] NULL. A bare expression is
// allowed as a predicate when it is boolean (a property or TRUE/FALSE), as
// in "1=1" style filters written as "TRUE".
func (p *sqlParser) parsePredicate() (sqlNode, error) {
	if p.isKeyword("EXISTS") {
		p.next()
		if err := p.expectOp("("); err != nil {
			return nil, err
		}
		prop, err := p.parseProperty()
		if err != nil {
			return nil, err
		}
		if err := p.expectOp(")"); err != nil {
			return nil, err
		}
		return existsNode{prop}, nil
	}
	left, err := p.parseAdditive()
	if err != nil {
		return nil, err
	}
	t := p.peek()
	switch {
	case t.kind == tokOp && isComparison(t.text):
		p.next()
		right, err := p.parseAdditive()
		if err != nil {
			return nil, err
		}
		return compareNode{op: t.text, left: left, right: right}, nil
	case p.isKeyword("IS"):
		p.next()
		negate := false
		if p.isKeyword("NOT") {
			p.next()
			negate = true
		}
		if !p.isKeyword("NULL") {
			return nil, p.errorf(p.peek(), "expected NULL after IS, got %s", p.peek())
		}
		p.next()
		return isNullNode{operand: left, negate: negate}, nil
	case p.isKeyword("NOT") || p.isKeyword("IN") || p.isKeyword("LIKE"):
		negate := false
		if p.isKeyword("NOT") {
			p.next()
			negate = true
		}
		switch {
		case p.isKeyword("IN"):
			p.next()
			return p.parseIn(left, negate)
		case p.isKeyword("LIKE"):
			p.next()
			return p.parseLike(left, negate)
		}
		return nil, p.errorf(p.peek(), "expected IN or LIKE after NOT, got %s", p.peek())
	}
	return left, nil
}

// isComparison reports the binary comparison operators.
func isComparison(op string) bool {
	switch op {
	case "=", "<>", "!=", ">", ">=", "<", "<=":
		return true
	}
	return false
}

// parseIn parses the parenthesized list after [NOT] IN.
func (p *sqlParser) parseIn(left sqlNode, negate bool) (sqlNode, error) {
	if err := p.expectOp("("); err != nil {
		return nil, err
	}
	n := inNode{operand: left, negate: negate}
	for {
		item, err := p.parseAdditive()
		if err != nil {
			return nil, err
		}
		n.items = append(n.items, item)
		if p.isOp(",") {
			p.next()
			continue
		}
		break
	}
	if err := p.expectOp(")"); err != nil {
		return nil, err
	}
	return n, nil
}

// parseLike parses the pattern after [NOT] LIKE and an optional ESCAPE
// character, which must be a one-character string constant.
func (p *sqlParser) parseLike(left sqlNode, negate bool) (sqlNode, error) {
	pattern, err := p.parseAdditive()
	if err != nil {
		return nil, err
	}
	n := likeNode{operand: left, pattern: pattern, negate: negate}
	if p.isKeyword("ESCAPE") {
		p.next()
		t := p.next()
		if t.kind != tokString || len([]rune(t.text)) != 1 {
			return nil, p.errorf(t, "ESCAPE needs a string of one character, got %s", t)
		}
		n.escape = []rune(t.text)[0]
		n.hasEscape = true
	}
	return n, nil
}

// parseAdditive parses terms joined by + and -.
func (p *sqlParser) parseAdditive() (sqlNode, error) {
	left, err := p.parseMultiplicative()
	if err != nil {
		return nil, err
	}
	for p.isOp("+") || p.isOp("-") {
		op := p.next().text
		right, err := p.parseMultiplicative()
		if err != nil {
			return nil, err
		}
		left = arithNode{op: op, left: left, right: right}
	}
	return left, nil
}

// parseMultiplicative parses factors joined by *, / and %.
func (p *sqlParser) parseMultiplicative() (sqlNode, error) {
	left, err := p.parseUnary()
	if err != nil {
		return nil, err
	}
	for p.isOp("*") || p.isOp("/") || p.isOp("%") {
		op := p.next().text
		right, err := p.parseUnary()
		if err != nil {
			return nil, err
		}
		left = arithNode{op: op, left: left, right: right}
	}
	return left, nil
}

// parseUnary parses leading + and - signs.
func (p *sqlParser) parseUnary() (sqlNode, error) {
	if p.isOp("+") || p.isOp("-") {
		if err := p.enter(); err != nil {
			return nil, err
		}
		defer p.leave()
		op := p.next().text
		inner, err := p.parseUnary()
		if err != nil {
			return nil, err
		}
		if op == "+" {
			return signNode{inner: inner}, nil
		}
		return signNode{inner: inner, negate: true}, nil
	}
	return p.parsePrimary()
}

// parsePrimary parses a constant, a property or a parenthesized
// expression. Parentheses may hold a whole predicate, so "(a = 1) AND b"
// and "(a + 1) * 2" both work.
func (p *sqlParser) parsePrimary() (sqlNode, error) {
	t := p.peek()
	switch {
	case t.kind == tokString:
		p.next()
		return constNode{t.text}, nil
	case t.kind == tokInt:
		p.next()
		return constNode{t.i}, nil
	case t.kind == tokFloat:
		p.next()
		return constNode{t.f}, nil
	case t.kind == tokKeyword && (t.text == "TRUE" || t.text == "FALSE"):
		p.next()
		return constNode{t.text == "TRUE"}, nil
	case t.kind == tokKeyword && t.text == "NULL":
		p.next()
		return constNode{nil}, nil
	case t.kind == tokParam:
		p.next()
		v, ok := p.params[strings.ToLower(t.text)]
		if !ok {
			return nil, p.errorf(t, "parameter %s is not defined by the rule", t.text)
		}
		return constNode{normalizeSQLValue(v)}, nil
	case t.kind == tokOp && t.text == "(":
		if err := p.enter(); err != nil {
			return nil, err
		}
		defer p.leave()
		p.next()
		inner, err := p.parseOr()
		if err != nil {
			return nil, err
		}
		if err := p.expectOp(")"); err != nil {
			return nil, err
		}
		return inner, nil
	case t.kind == tokIdent:
		return p.parseProperty()
	}
	return nil, p.errorf(t, "unexpected %s", t)
}

// systemProperties are the sys. names the emulator can resolve, lower case,
// mapped to how they are read from a message. Referencing any other system
// property is a configuration error, as evaluating one is an error on
// Service Bus.
var systemProperties = map[string]bool{
	"messageid": true, "correlationid": true, "to": true, "replyto": true,
	"label": true, "subject": true, "sessionid": true, "replytosessionid": true,
	"contenttype": true, "timetolive": true, "deliverycount": true,
	"sequencenumber": true, "enqueuedtimeutc": true, "scheduledenqueuetimeutc": true,
	"size": true,
}

// parseProperty parses [sys.|user.]name. Unknown system properties are
// refused here, at configuration time, because evaluating one is an error
// on Service Bus; a user property is just unknown when a message lacks it.
// Function calls (newid(), property()) are refused with their name.
func (p *sqlParser) parseProperty() (propertyNode, error) {
	t := p.next()
	if t.kind != tokIdent {
		return propertyNode{}, p.errorf(t, "expected a property name, got %s", t)
	}
	if p.isOp("(") {
		return propertyNode{}, p.errorf(t, "function %s() is not supported by the emulator", t.text)
	}
	scope, name := "user", t.text
	if p.isOp(".") {
		switch strings.ToLower(t.text) {
		case "sys", "user":
		default:
			return propertyNode{}, p.errorf(t, "unknown scope %q (use sys. or user.)", t.text)
		}
		p.next()
		nt := p.next()
		if nt.kind != tokIdent && nt.kind != tokKeyword {
			return propertyNode{}, p.errorf(nt, "expected a property name after %q., got %s", t.text, nt)
		}
		scope, name = strings.ToLower(t.text), nt.text
	}
	n := propertyNode{system: scope == "sys", name: strings.ToLower(name)}
	if n.system && !systemProperties[n.name] {
		return propertyNode{}, p.errorf(t, "unknown system property sys.%s", name)
	}
	return n, nil
}

// --- evaluation ---
//
// Every node evaluates to nil (unknown or NULL), int64, float64, string or
// bool. Operators on unknown give unknown, and AND/OR follow the
// three-valued tables of the filter documentation, so "NOT (a = 1)" does
// not match a message without a.

// constNode is a literal.
type constNode struct{ v any }

func (n constNode) eval(propertySource) any { return n.v }

// propertyNode reads a system or user property; name is lower case
// because property names ignore case.
type propertyNode struct {
	system bool
	name   string // lower case
}

func (n propertyNode) eval(p propertySource) any {
	var v any
	var ok bool
	if n.system {
		v, ok = p.system(n.name)
	} else {
		v, ok = p.user(n.name)
	}
	if !ok {
		return nil
	}
	return normalizeSQLValue(v)
}

// normalizeSQLValue maps AMQP property types onto the four evaluation
// types: every integer becomes int64, float32 becomes float64; other types
// (timestamps, UUIDs, binary) are compared as their string form.
func normalizeSQLValue(v any) any {
	switch x := v.(type) {
	case nil, string, bool, int64, float64:
		return x
	case int:
		return int64(x)
	case int8:
		return int64(x)
	case int16:
		return int64(x)
	case int32:
		return int64(x)
	case uint8:
		return int64(x)
	case uint16:
		return int64(x)
	case uint32:
		return int64(x)
	case uint64:
		if x > math.MaxInt64 {
			return float64(x)
		}
		return int64(x)
	case float32:
		return float64(x)
	}
	return fmt.Sprint(v)
}

// existsNode is EXISTS(property): true or false, never unknown.
type existsNode struct{ prop propertyNode }

func (n existsNode) eval(p propertySource) any {
	if n.prop.system {
		_, ok := p.system(n.prop.name)
		return ok
	}
	_, ok := p.user(n.prop.name)
	return ok
}

// notNode negates a boolean; NOT unknown stays unknown.
type notNode struct{ inner sqlNode }

func (n notNode) eval(p propertySource) any {
	b, ok := n.inner.eval(p).(bool)
	if !ok {
		return nil // NOT unknown is unknown
	}
	return !b
}

// andNode is three-valued AND: false wins over unknown.
type andNode struct{ left, right sqlNode }

func (n andNode) eval(p propertySource) any {
	l, lok := n.left.eval(p).(bool)
	if lok && !l {
		return false
	}
	r, rok := n.right.eval(p).(bool)
	switch {
	case rok && !r:
		return false
	case lok && rok:
		return true
	}
	return nil
}

// orNode is three-valued OR: true wins over unknown.
type orNode struct{ left, right sqlNode }

func (n orNode) eval(p propertySource) any {
	l, lok := n.left.eval(p).(bool)
	if lok && l {
		return true
	}
	r, rok := n.right.eval(p).(bool)
	switch {
	case rok && r:
		return true
	case lok && rok:
		return false
	}
	return nil
}

// isNullNode is IS [NOT] NULL: a missing property counts as NULL.
type isNullNode struct {
	operand sqlNode
	negate  bool
}

func (n isNullNode) eval(p propertySource) any {
	isNull := n.operand.eval(p) == nil
	return isNull != n.negate
}

// compareNode is a binary comparison; values that cannot be compared give
// unknown rather than an error, so one odd message cannot break a filter.
type compareNode struct {
	op          string
	left, right sqlNode
}

func (n compareNode) eval(p propertySource) any {
	c, ok := compareSQL(n.left.eval(p), n.right.eval(p))
	if !ok {
		return nil
	}
	switch n.op {
	case "=":
		return c == 0
	case "<>", "!=":
		return c != 0
	case ">":
		return c > 0
	case ">=":
		return c >= 0
	case "<":
		return c < 0
	case "<=":
		return c <= 0
	}
	return nil
}

// compareSQL orders two values; ok is false when either is unknown or they
// cannot be compared (a string with a number, say). Booleans are only equal
// or not: true sorts after false, which only = and <> ever look at.
func compareSQL(a, b any) (int, bool) {
	if a == nil || b == nil {
		return 0, false
	}
	switch x := a.(type) {
	case string:
		y, ok := b.(string)
		if !ok {
			return 0, false
		}
		return strings.Compare(x, y), true
	case bool:
		y, ok := b.(bool)
		if !ok {
			return 0, false
		}
		switch {
		case x == y:
			return 0, true
		case x:
			return 1, true
		}
		return -1, true
	}
	// Numbers: int64 with int64 exactly, anything else as float64 (C#
	// promotes long to double the same way).
	if xi, ok := a.(int64); ok {
		if yi, ok := b.(int64); ok {
			switch {
			case xi < yi:
				return -1, true
			case xi > yi:
				return 1, true
			}
			return 0, true
		}
	}
	xf, ok1 := toFloat(a)
	yf, ok2 := toFloat(b)
	if !ok1 || !ok2 {
		return 0, false
	}
	switch {
	case xf < yf:
		return -1, true
	case xf > yf:
		return 1, true
	case xf == yf:
		return 0, true
	}
	return 0, false // NaN
}

// toFloat widens a numeric value for mixed comparisons and arithmetic.
func toFloat(v any) (float64, bool) {
	switch x := v.(type) {
	case int64:
		return float64(x), true
	case float64:
		return x, true
	}
	return 0, false
}

// inNode is [NOT] IN (list): unknown only when the left operand is, as the
// documentation specifies; list items that cannot be compared are skipped.
type inNode struct {
	operand sqlNode
	items   []sqlNode
	negate  bool
}

func (n inNode) eval(p propertySource) any {
	v := n.operand.eval(p)
	if v == nil {
		return nil
	}
	for _, item := range n.items {
		if c, ok := compareSQL(v, item.eval(p)); ok && c == 0 {
			return !n.negate
		}
	}
	return n.negate
}

// likeNode is [NOT] LIKE pattern [ESCAPE c]; both sides must be strings.
type likeNode struct {
	operand, pattern sqlNode
	escape           rune
	hasEscape        bool
	negate           bool
}

func (n likeNode) eval(p propertySource) any {
	s, ok1 := n.operand.eval(p).(string)
	pat, ok2 := n.pattern.eval(p).(string)
	if !ok1 || !ok2 {
		return nil
	}
	return likeMatch([]rune(s), []rune(pat), n.escape, n.hasEscape) != n.negate
}

// likeMatch matches s against a LIKE pattern: % is any run of characters,
// _ any one character, and the escape character makes the next one literal.
// It runs in O(len(s) * len(pattern)) with the classic two-pointer
// backtracking on the last %.
func likeMatch(s, pat []rune, esc rune, hasEsc bool) bool {
	// Compile into tokens first so escapes are resolved once.
	type tok struct {
		r    rune
		kind byte // 'l' literal, '_' any one, '%' any run
	}
	toks := make([]tok, 0, len(pat))
	for i := 0; i < len(pat); i++ {
		switch c := pat[i]; {
		case hasEsc && c == esc && i+1 < len(pat):
			i++
			toks = append(toks, tok{r: pat[i], kind: 'l'})
		case c == '%':
			toks = append(toks, tok{kind: '%'})
		case c == '_':
			toks = append(toks, tok{kind: '_'})
		default:
			toks = append(toks, tok{r: c, kind: 'l'})
		}
	}
	si, ti := 0, 0
	star, mark := -1, 0
	for si < len(s) {
		switch {
		case ti < len(toks) && (toks[ti].kind == '_' || (toks[ti].kind == 'l' && toks[ti].r == s[si])):
			si++
			ti++
		case ti < len(toks) && toks[ti].kind == '%':
			star, mark = ti, si
			ti++
		case star >= 0:
			mark++
			si = mark
			ti = star + 1
		default:
			return false
		}
	}
	for ti < len(toks) && toks[ti].kind == '%' {
		ti++
	}
	return ti == len(toks)
}

// signNode is a unary + or -; non-numbers give unknown.
type signNode struct {
	inner  sqlNode
	negate bool
}

func (n signNode) eval(p propertySource) any {
	v := n.inner.eval(p)
	switch x := v.(type) {
	case int64:
		if n.negate {
			return -x
		}
		return x
	case float64:
		if n.negate {
			return -x
		}
		return x
	}
	return nil
}

// arithNode is + - * / %. Integers stay integers (division truncates, as
// C# long division does) and division by zero gives unknown; a float on
// either side makes the operation float; + also concatenates strings.
type arithNode struct {
	op          string
	left, right sqlNode
}

func (n arithNode) eval(p propertySource) any {
	a, b := n.left.eval(p), n.right.eval(p)
	if a == nil || b == nil {
		return nil
	}
	if n.op == "+" {
		// + concatenates strings, as C# does.
		if x, ok := a.(string); ok {
			if y, ok := b.(string); ok {
				return x + y
			}
		}
	}
	xi, aInt := a.(int64)
	yi, bInt := b.(int64)
	if aInt && bInt {
		switch n.op {
		case "+":
			return xi + yi
		case "-":
			return xi - yi
		case "*":
			return xi * yi
		case "/":
			if yi == 0 {
				return nil
			}
			return xi / yi
		case "%":
			if yi == 0 {
				return nil
			}
			return xi % yi
		}
	}
	xf, ok1 := toFloat(a)
	yf, ok2 := toFloat(b)
	if !ok1 || !ok2 {
		return nil
	}
	switch n.op {
	case "+":
		return xf + yf
	case "-":
		return xf - yf
	case "*":
		return xf * yf
	case "/":
		return xf / yf
	case "%":
		return math.Mod(xf, yf)
	}
	return nil
}
