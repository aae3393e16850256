package wire

import (
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func ptr[T any](v T) *T { return &v }

func props() *Map {
	return &Map{Entries: []MapEntry{{Key: Symbol("com.microsoft:x"), Value: int64(1)}}}
}

// performativeCases hold every performative fully populated and minimal; they
// also seed the frame fuzz corpus.
var performativeCases = []struct {
	name string
	v    any
}{
	{name: "open minimal", v: &Open{ContainerID: "c", MaxFrameSize: math.MaxUint32, ChannelMax: math.MaxUint16}},
	{name: "open full", v: &Open{
		ContainerID: "server", Hostname: "localhost", MaxFrameSize: 65536, ChannelMax: 0, IdleTimeout: 30000,
		OutgoingLocales: []Symbol{"en-US"}, IncomingLocales: []Symbol{"en-US", "de"},
		OfferedCapabilities: []Symbol{"ANONYMOUS-RELAY"}, DesiredCapabilities: []Symbol{"x"}, Properties: props(),
	}},
	{name: "begin minimal", v: &Begin{HandleMax: math.MaxUint32}},
	{name: "begin full", v: &Begin{
		RemoteChannel: ptr(uint16(3)), NextOutgoingID: 1, IncomingWindow: 5000, OutgoingWindow: math.MaxUint32,
		HandleMax: 0, OfferedCapabilities: []Symbol{"a"}, DesiredCapabilities: []Symbol{"b"}, Properties: props(),
	}},
	{name: "attach minimal", v: &Attach{Name: "l"}},
	{name: "attach full", v: &Attach{
		Name: "receiver-link", Handle: 7, Role: RoleReceiver,
		SndSettleMode: ptr(SndSettleModeMixed), RcvSettleMode: ptr(RcvSettleModeSecond),
		Source: &Source{
			Address: "queue", Durable: 2, ExpiryPolicy: "link-detach", Timeout: 10, Dynamic: true,
			DynamicNodeProperties: props(), DistributionMode: "move",
			Filter:         &Map{Entries: []MapEntry{{Key: Symbol("f"), Value: &Described{Descriptor: Symbol("apache.org:selector-filter:string"), Value: "a = 1"}}}},
			DefaultOutcome: &Modified{DeliveryFailed: true}, Outcomes: []Symbol{"amqp:accepted:list", "amqp:rejected:list"},
			Capabilities: []Symbol{"queue"},
		},
		Target:    &Target{Address: "$cbs", Durable: 1, ExpiryPolicy: "never", Timeout: 1, Dynamic: true, DynamicNodeProperties: props(), Capabilities: []Symbol{"c"}},
		Unsettled: &Map{Entries: []MapEntry{{Key: []byte{1}, Value: &Accepted{}}}}, IncompleteUnsettled: true,
		InitialDeliveryCount: ptr(uint32(0)), MaxMessageSize: ptr(uint64(1 << 30)),
		OfferedCapabilities: []Symbol{"o"}, DesiredCapabilities: []Symbol{"d"}, Properties: props(),
	}},
	{name: "flow minimal", v: &Flow{}},
	{name: "flow full", v: &Flow{
		NextIncomingID: ptr(uint32(1)), IncomingWindow: 2, NextOutgoingID: 3, OutgoingWindow: 4,
		Handle: ptr(uint32(0)), DeliveryCount: ptr(uint32(6)), LinkCredit: ptr(uint32(1000)), Available: ptr(uint32(8)),
		Drain: true, Echo: true, Properties: props(),
	}},
	{name: "transfer minimal", v: &Transfer{}},
	{name: "transfer full", v: &Transfer{
		Handle: 1, DeliveryID: ptr(uint32(99)), DeliveryTag: []byte{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16},
		MessageFormat: ptr(uint32(0)), Settled: ptr(false), More: true, RcvSettleMode: ptr(uint8(1)),
		State: &Received{SectionNumber: 1, SectionOffset: 2}, Resume: true, Aborted: true, Batchable: true,
	}},
	{name: "disposition minimal", v: &Disposition{}},
	{name: "disposition full", v: &Disposition{Role: RoleReceiver, First: 4, Last: ptr(uint32(9)), Settled: true,
		State: &Rejected{Error: &Error{Condition: ConditionDeadLetter, Info: &Map{Entries: []MapEntry{{Key: "DeadLetterReason", Value: "r"}}}}}, Batchable: true}},
	{name: "detach minimal", v: &Detach{}},
	{name: "detach full", v: &Detach{Handle: 2, Closed: true, Error: &Error{Condition: ConditionLinkDetachForced, Description: "idle"}}},
	{name: "end minimal", v: &End{}},
	{name: "end with error", v: &End{Error: &Error{Condition: ConditionInternalError}}},
	{name: "close minimal", v: &Close{}},
	{name: "close with error", v: &Close{Error: &Error{Condition: ConditionConnectionForced, Description: "bye", Info: props()}}},
}

func TestPerformativesRoundTrip(t *testing.T) {
	for _, tc := range performativeCases {
		t.Run(tc.name, func(t *testing.T) {
			got := roundTrip(t, tc.v)
			assert.Truef(t, Equal(tc.v, got), "got %#v\nwant %#v", got, tc.v)
		})
	}
}

func TestPerformativesByValueEncodeLikePointers(t *testing.T) {
	byPtr, err := AppendValue(nil, &Open{ContainerID: "c"})
	require.NoError(t, err)
	byVal, err := AppendValue(nil, Open{ContainerID: "c"})
	require.NoError(t, err)
	assert.Equal(t, byPtr, byVal)
}

// TestPerformativeDefaults decodes performatives whose optional fields are all
// absent and checks the specification defaults are filled in.
func TestPerformativeDefaults(t *testing.T) {
	tests := []struct {
		name string
		in   []byte
		want any
	}{
		{name: "open", in: []byte{0x00, 0x53, 0x10, 0xc0, 0x03, 0x01, 0xa1, 0x00},
			want: &Open{MaxFrameSize: math.MaxUint32, ChannelMax: math.MaxUint16}},
		{name: "open with nulls", in: []byte{0x00, 0x53, 0x10, 0xc0, 0x05, 0x03, 0xa1, 0x00, 0x40, 0x40},
			want: &Open{MaxFrameSize: math.MaxUint32, ChannelMax: math.MaxUint16}},
		{name: "begin", in: []byte{0x00, 0x53, 0x11, 0x45}, want: &Begin{HandleMax: math.MaxUint32}},
		{name: "attach", in: []byte{0x00, 0x53, 0x12, 0x45}, want: &Attach{}},
		{name: "flow", in: []byte{0x00, 0x53, 0x13, 0x45}, want: &Flow{}},
		{name: "transfer", in: []byte{0x00, 0x53, 0x14, 0x45}, want: &Transfer{}},
		{name: "disposition", in: []byte{0x00, 0x53, 0x15, 0x45}, want: &Disposition{}},
		{name: "detach", in: []byte{0x00, 0x53, 0x16, 0x45}, want: &Detach{}},
		{name: "end", in: []byte{0x00, 0x53, 0x17, 0x45}, want: &End{}},
		{name: "close", in: []byte{0x00, 0x53, 0x18, 0x45}, want: &Close{}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, _, err := DecodeValue(tc.in)
			require.NoError(t, err)
			assert.Equal(t, tc.want, got)
		})
	}
}

func TestPerformativeSymbolicDescriptorAndSingleSymbol(t *testing.T) {
	// amqp:open:list with container-id "c" and offered-capabilities given as
	// a single symbol rather than an array.
	name := []byte("amqp:open:list")
	in := append([]byte{0x00, 0xa3, byte(len(name))}, name...)
	in = append(in, 0xc0, 0x0d, 0x08, 0xa1, 0x01, 'c', 0x40, 0x40, 0x40, 0x40, 0x40, 0x40, 0xa3, 0x01, 'x')
	got, rest, err := DecodeValue(in)
	require.NoError(t, err)
	require.Empty(t, rest)
	open, ok := got.(*Open)
	require.True(t, ok, "got %T", got)
	assert.Equal(t, "c", open.ContainerID)
	assert.Equal(t, []Symbol{"x"}, open.OfferedCapabilities)
}

func TestPerformativeTrimsTrailingFields(t *testing.T) {
	// Attach with only mandatory fields: name, handle, role.
	got, err := AppendValue(nil, &Attach{Name: "n", Handle: 1, Role: RoleSender})
	require.NoError(t, err)
	assert.Equal(t, []byte{0x00, 0x53, 0x12, 0xc0, 0x07, 0x03, 0xa1, 0x01, 'n', 0x52, 0x01, 0x42}, got)
}

func TestPerformativeFieldTypeMismatch(t *testing.T) {
	tests := []struct {
		name string
		in   []byte
	}{
		{name: "attach handle is a string", in: []byte{0x00, 0x53, 0x12, 0xc0, 0x05, 0x02, 0x40, 0xa1, 0x01, 'x'}},
		{name: "open capabilities array of string", in: []byte{0x00, 0x53, 0x10, 0xc0, 0x0b, 0x08, 0x40, 0x40, 0x40, 0x40, 0x40, 0x40, 0xe0, 0x02, 0x00, 0xa1}},
		{name: "transfer state not a state", in: []byte{0x00, 0x53, 0x14, 0xc0, 0x0b, 0x08, 0x43, 0x40, 0x40, 0x40, 0x40, 0x40, 0x40, 0x00, 0x53, 0x1d, 0x45}},
		{name: "begin remote channel wrong width", in: []byte{0x00, 0x53, 0x11, 0xc0, 0x03, 0x01, 0x52, 0x01}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := DecodeValue(tc.in)
			assert.Error(t, err)
		})
	}
}
