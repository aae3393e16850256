package wire

import (
	"fmt"
	"reflect"
)

// decodeComposite builds the Go struct for a known descriptor from its
// described value, which must be a list. Missing trailing fields take their
// defaults and extra fields are ignored, as the specification requires of a
// receiver so that later protocol versions can add fields.
func decodeComposite(code uint64, v any) (any, error) {
	name := descriptorNames[code]
	fields, ok := v.([]any)
	if !ok {
		return nil, fmt.Errorf("wire: %s: described value is %T, want a list", name, v)
	}
	r := &fieldReader{name: string(name), fields: fields}
	var out any
	switch code {
	case descOpen:
		out = decodeOpen(r)
	case descBegin:
		out = decodeBegin(r)
	case descAttach:
		out = decodeAttach(r)
	case descFlow:
		out = decodeFlow(r)
	case descTransfer:
		out = decodeTransfer(r)
	case descDisposition:
		out = decodeDisposition(r)
	case descDetach:
		out = decodeDetach(r)
	case descEnd:
		out = decodeEnd(r)
	case descClose:
		out = decodeClose(r)
	case descError:
		out = decodeError(r)
	case descReceived:
		out = decodeReceived(r)
	// accepted and released have no fields (part 3 sections 3.4.2 and 3.4.4),
	// so there is nothing to read.
	case descAccepted:
		out = &Accepted{}
	case descRejected:
		out = decodeRejected(r)
	case descReleased:
		out = &Released{}
	case descModified:
		out = decodeModified(r)
	case descSource:
		out = decodeSource(r)
	case descTarget:
		out = decodeTarget(r)
	case descSASLMechanisms:
		out = decodeSASLMechanisms(r)
	case descSASLInit:
		out = decodeSASLInit(r)
	case descSASLChallenge:
		out = decodeSASLChallenge(r)
	case descSASLResponse:
		out = decodeSASLResponse(r)
	case descSASLOutcome:
		out = decodeSASLOutcome(r)
	default:
		return nil, fmt.Errorf("wire: no decoder for descriptor %#x", code) // unreachable: callers check descriptorNames
	}
	// A field of the wrong type fails the whole composite: falling back to the
	// default could, say, attach a link with a settle mode the peer never asked
	// for, which is worse than refusing the frame.
	if r.err != nil {
		return nil, r.err
	}
	return out, nil
}

// fieldReader walks the fields of a composite list in order, remembering the
// first type mismatch so that decoders read as a flat list of assignments.
// next counts every field taken, absent ones included, so an error names the
// field's position in the specification's list.
type fieldReader struct {
	name   string
	fields []any
	next   int
	err    error
}

// take returns the next field, or nil once the list is exhausted (an absent
// trailing field).
func (r *fieldReader) take() any {
	i := r.next
	r.next++
	if i >= len(r.fields) {
		return nil
	}
	return r.fields[i]
}

// mismatch keeps only the first error: decoders go on reading after one, and
// the first is the one that explains the rest.
func (r *fieldReader) mismatch(got any, want string) {
	if r.err == nil {
		r.err = fmt.Errorf("wire: %s field %d: got %T, want %s", r.name, r.next-1, got, want)
	}
}

// readField stores the next field in dst when it is present and of type T, and
// reports whether it was present. A null field leaves dst unchanged, so callers
// pre-set defaults.
// Null and an omitted trailing field mean the same (part 1 section 1.4), so
// both take this path.
func readField[T any](r *fieldReader, dst *T) bool {
	v := r.take()
	if v == nil {
		return false
	}
	t, ok := v.(T)
	if !ok {
		r.mismatch(v, reflect.TypeFor[T]().String())
		return false
	}
	*dst = t
	return true
}

// readOptional stores a pointer to the next field in dst when it is present.
// It is for fields whose absence differs from their zero value, such as
// remote-channel or delivery-id, where 0 is a valid number.
func readOptional[T any](r *fieldReader, dst **T) {
	var t T
	if readField(r, &t) {
		*dst = &t
	}
}

// readSymbols reads a field of "multiple" symbols, which a peer may send as a
// single symbol or as an array of symbols.
// A field declared multiple may carry one value instead of an array, so both
// forms must decode, even though go-amqp itself always sends an array.
func readSymbols(r *fieldReader, dst *[]Symbol) {
	switch v := r.take().(type) {
	case nil:
	case Symbol:
		*dst = []Symbol{v}
	case Array:
		out := make([]Symbol, 0, len(v))
		for _, e := range v {
			s, ok := e.(Symbol)
			if !ok {
				r.mismatch(e, "wire.Symbol array element")
				return
			}
			out = append(out, s)
		}
		*dst = out
	default:
		r.mismatch(v, "wire.Symbol or array of wire.Symbol")
	}
}

// readAddress reads a terminus address. The specification types it as "*"
// (any address type); AMQP's address-string is a string, but accept a symbol
// too since some peers send one.
func readAddress(r *fieldReader, dst *string) {
	switch v := r.take().(type) {
	case nil:
	case string:
		*dst = v
	case Symbol:
		*dst = string(v)
	default:
		r.mismatch(v, "string")
	}
}

// readRole reads a role, which travels as a boolean.
func readRole(r *fieldReader, dst *Role) {
	var b bool
	readField(r, &b)
	*dst = Role(b)
}

// optZero returns nil (absent) for the zero value of a field whose default is
// the zero value, so it is trimmed or sent as null.
// Leaving such a field out changes nothing for the peer and lets trimFields
// shorten the list.
func optZero[T comparable](v T) any {
	var zero T
	if v == zero {
		return nil
	}
	return v
}

// optDefault returns nil (absent) when v equals the field's default.
func optDefault[T comparable](v, def T) any {
	if v == def {
		return nil
	}
	return v
}

// optPtr returns the pointed-to value, or nil for an absent field.
func optPtr[T any](p *T) any {
	if p == nil {
		return nil
	}
	return *p
}

// optRef returns p as a value for a composite or map field, or an untyped nil
// so that a missing one is trimmed.
// A typed nil pointer stored in []any is not == nil, so trimFields would keep
// it and send an explicit null; returning untyped nil lets it be trimmed.
func optRef[T any](p *T) any {
	if p == nil {
		return nil
	}
	return p
}

// optSymbols returns a multiple-symbol field as an array, or nil when empty.
func optSymbols(s []Symbol) any {
	if len(s) == 0 {
		return nil
	}
	return s
}

// optState returns a delivery state, or an untyped nil when there is none.
// A nil *Accepted inside the DeliveryState interface is not == nil, hence the
// extra isNilPointer check.
func optState(s DeliveryState) any {
	if s == nil || isNilPointer(s) {
		return nil
	}
	return s
}
