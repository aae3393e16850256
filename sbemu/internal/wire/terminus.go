package wire

// Source is the source terminus of a link (part 3 section 3.5.3): where a
// receiver's messages come from. A Service Bus receiver puts the queue (or
// "<queue>/$DeadLetterQueue") in Address; selector filters arrive in Filter
// as *[Described] values.
type Source struct {
	// Address names the node; "" is absent (a dynamic node).
	Address string
	// Durable is the terminus durability: 0 none (default), 1
	// configuration, 2 unsettled-state.
	Durable uint32
	// ExpiryPolicy is link-detach, session-end (the default, also meant by
	// ""), connection-close or never.
	ExpiryPolicy Symbol
	// Timeout in seconds before an expired terminus is destroyed.
	Timeout uint32
	// Dynamic asks the peer to create the node.
	Dynamic bool
	// DynamicNodeProperties configure a dynamic node.
	DynamicNodeProperties *Map
	// DistributionMode is move or copy; "" is absent.
	DistributionMode Symbol
	// Filter maps filter names to described filter values.
	Filter *Map
	// DefaultOutcome is the outcome for unsettled deliveries when the link
	// ends, usually a delivery state such as *[Released]; nil is absent.
	DefaultOutcome any
	// Outcomes are the descriptor names of the outcomes the source supports.
	Outcomes []Symbol
	// Capabilities are extensions of the source.
	Capabilities []Symbol
}

func (Source) descriptor() uint64 { return descSource }

func (s Source) fields() []any {
	return []any{
		optZero(s.Address),
		optZero(s.Durable),
		optZero(s.ExpiryPolicy),
		optZero(s.Timeout),
		optZero(s.Dynamic),
		optRef(s.DynamicNodeProperties),
		optZero(s.DistributionMode),
		optRef(s.Filter),
		s.DefaultOutcome,
		optSymbols(s.Outcomes),
		optSymbols(s.Capabilities),
	}
}

func decodeSource(r *fieldReader) *Source {
	s := &Source{}
	readAddress(r, &s.Address)
	readField(r, &s.Durable)
	readField(r, &s.ExpiryPolicy)
	readField(r, &s.Timeout)
	readField(r, &s.Dynamic)
	readField(r, &s.DynamicNodeProperties)
	readField(r, &s.DistributionMode)
	readField(r, &s.Filter)
	// default-outcome is typed * (any outcome) in part 3 section 3.5.3, so it is
	// kept as decoded instead of being forced into one Go type.
	s.DefaultOutcome = r.take()
	readSymbols(r, &s.Outcomes)
	readSymbols(r, &s.Capabilities)
	return s
}

// Target is the target terminus of a link (part 3 section 3.5.4): where a
// sender's messages go. The SDK's CBS and management receivers use odd-looking
// target addresses; echo them back unchanged.
type Target struct {
	// Address names the node; "" is absent.
	Address string
	// Durable is the terminus durability, as in [Source.Durable].
	Durable uint32
	// ExpiryPolicy is as in [Source.ExpiryPolicy].
	ExpiryPolicy Symbol
	// Timeout in seconds before an expired terminus is destroyed.
	Timeout uint32
	// Dynamic asks the peer to create the node.
	Dynamic bool
	// DynamicNodeProperties configure a dynamic node.
	DynamicNodeProperties *Map
	// Capabilities are extensions of the target.
	Capabilities []Symbol
}

func (Target) descriptor() uint64 { return descTarget }

func (t Target) fields() []any {
	return []any{
		optZero(t.Address),
		optZero(t.Durable),
		optZero(t.ExpiryPolicy),
		optZero(t.Timeout),
		optZero(t.Dynamic),
		optRef(t.DynamicNodeProperties),
		optSymbols(t.Capabilities),
	}
}

func decodeTarget(r *fieldReader) *Target {
	t := &Target{}
	readAddress(r, &t.Address)
	readField(r, &t.Durable)
	readField(r, &t.ExpiryPolicy)
	readField(r, &t.Timeout)
	readField(r, &t.Dynamic)
	readField(r, &t.DynamicNodeProperties)
	readSymbols(r, &t.Capabilities)
	return t
}
