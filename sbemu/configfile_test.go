package sbemu

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore/to"
	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sbretry/retry/sbemu/broker"
)

// sampleConfig is the Config.json shipped as an example; README points at it.
const sampleConfig = "testdata/Config.json"

func TestConfigFromFileReadsTheSample(t *testing.T) {
	cfg, err := ConfigFromFile(sampleConfig)
	require.NoError(t, err)

	assert.Equal(t, []broker.QueueConfig{
		{
			Name: "orders", LockDuration: 30 * time.Second, MaxDeliveryCount: 5,
			DuplicateDetectionWindow: 10 * time.Minute, DefaultTTL: 24 * time.Hour, DeadLetterOnExpiration: true,
			ForwardDeadLetteredMessagesTo: "orders-parking",
		},
		{Name: "orders-parking"},
		{Name: "audit"}, // P10675199D is .NET's "never"
	}, cfg.Queues)

	require.Len(t, cfg.Topics, 1)
	topic := cfg.Topics[0]
	assert.Equal(t, "order-events", topic.Name)
	assert.Equal(t, time.Hour, topic.DefaultTTL)
	assert.Equal(t, time.Minute, topic.DuplicateDetectionWindow)
	require.Len(t, topic.Subscriptions, 3)
	assert.Equal(t, broker.SubscriptionConfig{Name: "everything"}, topic.Subscriptions[0])
	europe := topic.Subscriptions[1]
	assert.Equal(t, time.Minute, europe.LockDuration)
	assert.Equal(t, 3, europe.MaxDeliveryCount)
	assert.True(t, europe.DeadLetterOnExpiration)
	assert.Equal(t, []broker.RuleConfig{{
		Name:      "eu-region",
		SQLFilter: "region IN ('eu-west', 'eu-north') AND sys.Label LIKE 'order.%'",
		SQLAction: "SET routed = 'europe'",
	}}, europe.Rules)
	refunds := topic.Subscriptions[2]
	assert.Equal(t, "audit", refunds.ForwardTo)
	assert.Equal(t, []broker.RuleConfig{{
		Name:              "refund-events",
		CorrelationFilter: &broker.CorrelationFilter{Subject: "order.refunded", Properties: map[string]any{"channel": "web"}},
	}}, refunds.Rules)
}

// TestConfigFromFileServesTheSample starts the emulator on the sample file
// and routes messages through its rules and forwarding with the real SDK.
func TestConfigFromFileServesTheSample(t *testing.T) {
	cfg, err := ConfigFromFile(sampleConfig)
	require.NoError(t, err)
	em := startEmulator(t, cfg)
	client := newClient(t, em)
	sender := newSender(t, client, "order-events")
	require.NoError(t, sender.SendMessage(ctxT(t), &azservicebus.Message{
		Body: []byte("created"), Subject: to.Ptr("order.created"), ApplicationProperties: map[string]any{"region": "eu-west"},
	}, nil))
	require.NoError(t, sender.SendMessage(ctxT(t), &azservicebus.Message{
		Body: []byte("refunded"), Subject: to.Ptr("order.refunded"), ApplicationProperties: map[string]any{"channel": "web"},
	}, nil))

	europe := receiveOne(t, newSubscriptionReceiver(t, client, "order-events", "europe", nil))
	assert.Equal(t, "created", string(europe.Body))
	assert.Equal(t, "europe", europe.ApplicationProperties["routed"])
	assert.Equal(t, "eu-region", europe.ApplicationProperties[broker.PropertyRuleName])

	audit := receiveOne(t, newReceiver(t, client, "audit", nil))
	assert.Equal(t, "refunded", string(audit.Body), "refunds forwards to audit")

	all, _ := em.Broker().Subscription("order-events", "everything")
	assert.Equal(t, broker.Stats{Active: 2}, all.Stats())
}

func TestConfigFromJSONErrors(t *testing.T) {
	// wrap puts a queue list and a topic list into an otherwise valid file.
	wrap := func(queues, topics string) string {
		return `{"UserConfig": {"Namespaces": [{"Name": "ns", "Queues": [` + queues + `], "Topics": [` + topics + `]}], "Logging": {"Type": "File"}}}`
	}
	tests := []struct {
		name, json, wantText string
	}{
		{"not JSON", `{`, "unexpected EOF"},
		{"no UserConfig", `{}`, "no UserConfig"},
		{"two namespaces", `{"UserConfig": {"Namespaces": [{}, {}]}}`, "exactly one namespace"},
		{"unknown top-level key", `{"UserConfig": {"Namespaces": [{}]}, "Extra": 1}`, `unknown field "Extra"`},
		{"unknown namespace key", `{"UserConfig": {"Namespaces": [{"Queuez": []}]}}`, `namespace: json: unknown field "Queuez"`},
		{"queue without name", wrap(`{"Properties": {}}`, ""), "Queues[0]: queue: missing Name"},
		{"bad duration", wrap(`{"Name": "q", "Properties": {"LockDuration": "1 minute"}}`, ""), `queue "q": LockDuration: "1 minute" is not an ISO 8601 duration`},
		{"lock too long", wrap(`{"Name": "q", "Properties": {"LockDuration": "PT10M"}}`, ""), `queue "q": LockDuration: "PT10M" exceeds the Service Bus maximum`},
		{"zero lock", wrap(`{"Name": "q", "Properties": {"LockDuration": "PT0S"}}`, ""), `queue "q": LockDuration: "PT0S" must be positive`},
		{"delivery count zero", wrap(`{"Name": "q", "Properties": {"MaxDeliveryCount": 0}}`, ""), `queue "q": MaxDeliveryCount: 0 must be at least 1`},
		{"delivery count wrong type", wrap(`{"Name": "q", "Properties": {"MaxDeliveryCount": "ten"}}`, ""), `queue "q": Properties: json: cannot unmarshal string`},
		{"dedup window too short", wrap(`{"Name": "q", "Properties": {"RequiresDuplicateDetection": true, "DuplicateDetectionHistoryTimeWindow": "PT1S"}}`, ""), `DuplicateDetectionHistoryTimeWindow: "PT1S" is outside the Service Bus range`},
		{"unknown property", wrap(`{"Name": "q", "Properties": {"LockDurration": "PT1M"}}`, ""), `queue "q": LockDurration: not a property of a queue`},
		{"queue property on a topic", wrap("", `{"Name": "t", "Properties": {"LockDuration": "PT1M"}}`), `topic "t": LockDuration: not a property of a topic`},
		{"subscriptions on a queue", wrap(`{"Name": "q", "Subscriptions": []}`, ""), `queue "q": Subscriptions is only allowed on a topic`},
		{"unknown forward target", wrap(`{"Name": "q", "Properties": {"ForwardTo": "nowhere"}}`, ""), `queue "q": ForwardTo "nowhere": no such queue or topic`},
		{"subscription property", wrap("", `{"Name": "t", "Subscriptions": [{"Name": "s", "Properties": {"DefaultMessageTimeToLive": "PT-1S"}}]}`), `topic "t": Subscriptions[0]: subscription "s": DefaultMessageTimeToLive`},
		{"malformed SQL", wrap("", `{"Name": "t", "Subscriptions": [{"Name": "s", "Rules": [{"Name": "r", "Properties": {"FilterType": "Sql", "SqlFilter": {"SqlExpression": "a = "}}}]}]}`), `rule "r": SQLFilter "a = "`},
		{"unknown filter type", wrap("", `{"Name": "t", "Subscriptions": [{"Name": "s", "Rules": [{"Name": "r", "Properties": {"FilterType": "Regex"}}]}]}`), `rule "r": FilterType: "Regex" is neither`},
		{"sql filter without expression", wrap("", `{"Name": "t", "Subscriptions": [{"Name": "s", "Rules": [{"Name": "r", "Properties": {"FilterType": "Sql"}}]}]}`), `rule "r": SqlFilter.SqlExpression: required`},
		{"rule without key name", `{"UserConfig": {"Namespaces": [{"AuthorizationRules": [{"PrimaryKey": "k", "Rights": ["Listen"]}]}]}}`, `AuthorizationRules[0] "": empty KeyName`},
		{"rule without key", `{"UserConfig": {"Namespaces": [{"AuthorizationRules": [{"KeyName": "r", "Rights": ["Listen"]}]}]}}`, `AuthorizationRules[0] "r": empty PrimaryKey`},
		{"rule with unknown right", `{"UserConfig": {"Namespaces": [{"AuthorizationRules": [{"KeyName": "r", "PrimaryKey": "k", "Rights": ["Read"]}]}]}}`, `unknown access right "Read"`},
		{"rule without rights", `{"UserConfig": {"Namespaces": [{"AuthorizationRules": [{"KeyName": "r", "PrimaryKey": "k"}]}]}}`, `no access rights`},
		{"duplicate rule", `{"UserConfig": {"Namespaces": [{"AuthorizationRules": [{"KeyName": "r", "PrimaryKey": "k", "Rights": ["Send"]}, {"KeyName": "R", "PrimaryKey": "k", "Rights": ["Send"]}]}]}}`, `AuthorizationRules[1] "R": the key name is taken`},
		{"unknown rule key", `{"UserConfig": {"Namespaces": [{"AuthorizationRules": [{"KeyName": "r", "Key": "k"}]}]}}`, `AuthorizationRules[0]: json: unknown field "Key"`},
		{"unknown correlation field", wrap("", `{"Name": "t", "Subscriptions": [{"Name": "s", "Rules": [{"Name": "r", "Properties": {"FilterType": "Correlation", "CorrelationFilter": {"Subject": "x"}}}]}]}`), `rule "r": Properties: json: unknown field "Subject"`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ConfigFromJSON([]byte(tc.json))
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.wantText)
			assert.True(t, strings.HasPrefix(err.Error(), "sbemu: config"), err.Error())
		})
	}
}

func TestConfigFromFileNamesTheFile(t *testing.T) {
	_, err := ConfigFromFile(filepath.Join(t.TempDir(), "missing.json"))
	require.ErrorIs(t, err, os.ErrNotExist)

	path := filepath.Join(t.TempDir(), "Config.json")
	require.NoError(t, os.WriteFile(path, []byte(`{}`), 0o600))
	_, err = ConfigFromFile(path)
	require.Error(t, err)
	assert.Contains(t, err.Error(), path+": sbemu: config: no UserConfig")
}

// FuzzConfigFromJSON checks that no input makes the loader panic.
func FuzzConfigFromJSON(f *testing.F) {
	sample, err := os.ReadFile(sampleConfig)
	require.NoError(f, err)
	f.Add(sample)
	f.Add([]byte(`{"UserConfig": {"Namespaces": [{"Queues": [{"Name": "q"}]}]}}`))
	f.Add([]byte("// c\n{\"UserConfig\": {\"Namespaces\": [{\"Queues\": [{\"Name\": \"q//\\\"\"}]}]}} // d"))
	f.Fuzz(func(t *testing.T, data []byte) {
		_, _ = ConfigFromJSON(data)
	})
}

// TestConfigFromJSONSkipsLineComments: Microsoft's emulator ships its
// default Config.json with "//" comment lines, which must load; a "//"
// inside a string stays.
func TestConfigFromJSONSkipsLineComments(t *testing.T) {
	data := []byte(`// Service Bus emulator configuration
{
  "UserConfig": {
    // One namespace, as the emulator serves.
    "Namespaces": [
      {
        "Name": "sbemulatorns",
        "Queues": [ { "Name": "orders" } ], // trailing comment
        "Topics": [
          {
            "Name": "events",
            "Subscriptions": [
              {
                "Name": "links",
                "Rules": [ { "Name": "r", "Properties": { "FilterType": "Sql",
                  "SqlFilter": { "SqlExpression": "url = 'sb://host/q' AND note = 'a \" // b'" } } } ]
              }
            ]
          }
        ]
      }
    ],
    "Logging": { "Type": "File" }
  }
}
`)
	cfg, err := ConfigFromJSON(data)
	require.NoError(t, err)
	require.Len(t, cfg.Queues, 1)
	assert.Equal(t, "orders", cfg.Queues[0].Name)
	require.Len(t, cfg.Topics, 1)
	rules := cfg.Topics[0].Subscriptions[0].Rules
	require.Len(t, rules, 1)
	assert.Equal(t, `url = 'sb://host/q' AND note = 'a " // b'`, rules[0].SQLFilter)

	_, err = ConfigFromJSON([]byte("{\"UserConfig\": // no value\n}"))
	require.Error(t, err, "a comment is not a value")
}

func TestBlankCommentsKeepsOffsetsAndInput(t *testing.T) {
	in := []byte("{\"a\": 1} // x\n// y\n")
	out := blankComments(in)
	assert.Equal(t, "{\"a\": 1}     \n    \n", string(out))
	assert.Equal(t, "{\"a\": 1} // x\n// y\n", string(in), "the input is not modified")
	same := []byte(`{"u": "sb://x"}`)
	assert.Equal(t, string(same), string(blankComments(same)))
}

func TestConfigFromJSONRequiresSession(t *testing.T) {
	cfg, err := ConfigFromJSON([]byte(`{"UserConfig": {"Namespaces": [{"Name": "ns",
		"Queues": [{"Name": "q", "Properties": {"RequiresSession": true}}],
		"Topics": [{"Name": "t", "Subscriptions": [{"Name": "s", "Properties": {"RequiresSession": true}}]}]}],
		"Logging": {"Type": "File"}}}`))
	require.NoError(t, err)
	require.Len(t, cfg.Queues, 1)
	assert.True(t, cfg.Queues[0].RequiresSession)
	require.Len(t, cfg.Topics, 1)
	assert.True(t, cfg.Topics[0].Subscriptions[0].RequiresSession)
}

// TestConfigFromJSONReadsAuthorizationRules reads sbemu's AuthorizationRules
// extension of the namespace object.
func TestConfigFromJSONReadsAuthorizationRules(t *testing.T) {
	cfg, err := ConfigFromJSON([]byte(`{"UserConfig": {"Namespaces": [{"Name": "ns",
		"Queues": [{"Name": "q"}],
		"AuthorizationRules": [
			{"KeyName": "listen-only", "PrimaryKey": "p1", "SecondaryKey": "s1", "Rights": ["Listen"]},
			{"KeyName": "ops", "PrimaryKey": "p2", "Rights": ["Manage", "Send", "Listen"]}
		]}]}}`))
	require.NoError(t, err)
	assert.Equal(t, []AuthorizationRule{
		{KeyName: "listen-only", PrimaryKey: "p1", SecondaryKey: "s1", Rights: []AccessRight{RightListen}},
		{KeyName: "ops", PrimaryKey: "p2", Rights: []AccessRight{RightManage, RightSend, RightListen}},
	}, cfg.AuthorizationRules)
}
