package broker

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestRulesSelectMessages(t *testing.T) {
	b, _ := newTopicBroker(t, nil, TopicConfig{Name: "t", Subscriptions: []SubscriptionConfig{
		{Name: "all"},
		{Name: "blue", Rules: []RuleConfig{{Name: "blue", SQLFilter: "color = 'blue'"}}},
		{Name: "none", Rules: []RuleConfig{{Name: "none", SQLFilter: "1=0"}}},
		{Name: "corr", Rules: []RuleConfig{{Name: "corr", CorrelationFilter: &CorrelationFilter{
			Subject: "order", Properties: map[string]any{"region": "eu", "tier": int64(2)},
		}}}},
		{Name: "two-plain", Rules: []RuleConfig{{Name: "a", SQLFilter: "TRUE"}, {Name: "b", SQLFilter: "color IS NOT NULL"}}},
		{Name: "actions", Rules: []RuleConfig{
			{Name: "plain", SQLFilter: "TRUE"},
			{Name: "tag", SQLFilter: "color = 'blue'", SQLAction: "SET seen = 'yes'; SET sys.Label = 'tagged'; REMOVE color"},
		}},
	}})
	topic, _ := b.Queue("t")
	subject := "order"
	blue := withProps(newMsg("1", "blue"), map[string]any{"color": "blue", "region": "eu", "tier": int32(2)})
	blue.Properties.Subject = &subject
	mustSend(t, topic, blue)
	mustSend(t, topic, withProps(newMsg("2", "red"), map[string]any{"color": "red", "region": "eu", "tier": int32(3)}))

	bodies := func(name string) []string {
		var out []string
		sub := mustSubscription(t, b, "t", name)
		for _, m := range sub.ActiveMessages() {
			out = append(out, string(m.GetData()))
		}
		return out
	}
	assert.Equal(t, []string{"blue", "red"}, bodies("all"))
	assert.Equal(t, []string{"blue"}, bodies("blue"))
	assert.Empty(t, bodies("none"))
	assert.Equal(t, []string{"blue"}, bodies("corr"), "every correlation condition must hold")
	assert.Equal(t, []string{"blue", "red"}, bodies("two-plain"), "rules without actions give one copy")

	// The plain rule gives one copy, the rule with an action one more.
	msgs := mustSubscription(t, b, "t", "actions").ActiveMessages()
	require.Len(t, msgs, 3)
	tagged := msgs[1]
	assert.Equal(t, "blue", string(tagged.GetData()))
	assert.Equal(t, "tag", tagged.ApplicationProperties[PropertyRuleName])
	assert.Equal(t, "yes", tagged.ApplicationProperties["seen"])
	assert.NotContains(t, tagged.ApplicationProperties, "color")
	assert.Equal(t, "tagged", *tagged.Properties.Subject)
	assert.Equal(t, "blue", msgs[0].ApplicationProperties["color"], "the action changes its own copy only")
	assert.Equal(t, "order", *msgs[0].Properties.Subject)
}
