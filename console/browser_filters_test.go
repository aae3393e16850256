package console

import (
	"net/url"
	"testing"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sbretry/retry/internal/sbtest"
	"github.com/sbretry/retry/sbemu"
)

// TestBrowserFilterAndRedriveAllMatching drives a real browser: the dead-letter page shows a group
// Service Bus made itself (a message abandoned until it ran out of deliveries) next to the retry
// library's; the operator filters by a property, sees what matches, previews the redrive of all of
// it and runs it; the run's page shows its batches and the result, and the broker holds exactly the
// matching dead letters as fresh deliveries.
func TestBrowserFilterAndRedriveAllMatching(t *testing.T) {
	tab := newBrowser(t)
	h := sbtest.New(t)
	seedTenant(t, h, "acme", "invalid payload", "a-1", "a-2", "a-3", "a-4", "a-5")
	seedTenant(t, h, "globex", "timeout calling the ledger", "g-1", "g-2")
	// One that Service Bus dead-letters: abandoned MaxDeliveryCount (10) times.
	h.Send(t, sbtest.Message("poison-1"))
	ctx := sbtest.Context(t)
	r, err := h.Client.NewReceiverForQueue(sbtest.Queue, nil)
	require.NoError(t, err)
	for range 10 {
		msgs, err := r.ReceiveMessages(ctx, 1, nil)
		require.NoError(t, err)
		for _, m := range msgs {
			require.NoError(t, r.AbandonMessage(ctx, m, nil))
		}
	}
	require.NoError(t, r.Close(ctx))
	require.Equal(t, 8, h.Stats(t).DeadLettered)
	s := newSite(t, h, &Options{BatchSize: 2})

	require.NoError(t, chromedp.Do(tab,
		chromedp.Navigate(s.srv.URL+"/deadletters?e=orders"),
		chromedp.WaitVisible(chromedp.ID("groups")),
	))
	by, err := chromedp.Run(tab, chromedp.Evaluate[[]string](`[...document.querySelectorAll("#groups td.by")].map(td => td.textContent)`))
	require.NoError(t, err)
	assert.ElementsMatch(t, []string{"the retry library", "the retry library", "Service Bus"}, by)
	require.NoError(t, chromedp.Do(tab,
		chromedp.SendKeys(chromedp.ID("filter-prop"), "tenant=acme"),
	))
	click(t, tab, "#filter-go")
	require.NoError(t, chromedp.Do(tab, chromedp.WaitVisible(chromedp.ID("matching-items"))))
	assert.Equal(t, "5 dead letters match: property tenant=acme", text(t, tab, "#match-count"))
	screenshot(t, tab, "console-filter.png")

	click(t, tab, "#redrive-matching")
	require.NoError(t, chromedp.Do(tab, chromedp.WaitVisible(chromedp.ID("preview-items"))))
	refs, err := chromedp.Run(tab, chromedp.Evaluate[[]string](`[...document.querySelectorAll("#preview-items tr.item")].map(r => r.dataset.ref)`))
	require.NoError(t, err)
	assert.Len(t, refs, 5)
	assert.Contains(t, text(t, tab, "#preview-batches"), "3 batches of up to 2")
	click(t, tab, "#run")
	require.NoError(t, chromedp.Do(tab, chromedp.WaitVisible(chromedp.ID("result-summary"))))
	assert.Equal(t, "Resubmitted 5 of 5 to orders", text(t, tab, "#result-summary"))
	steps, err := chromedp.Run(tab, chromedp.Evaluate[[]string](`[...document.querySelectorAll("#progress li.batch")].map(li => li.textContent)`))
	require.NoError(t, err)
	assert.Equal(t, []string{
		"Batch 1 of 3: 2 of 2 done, 2 of 5 in all",
		"Batch 2 of 3: 2 of 2 done, 4 of 5 in all",
		"Batch 3 of 3: 1 of 1 done, 5 of 5 in all",
	}, steps)
	screenshot(t, tab, "console-batches.png")

	assert.ElementsMatch(t, []string{"g-1", "g-2", "poison-1"}, deadLetterIDs(t, h))
	assert.ElementsMatch(t, []string{"a-1", "a-2", "a-3", "a-4", "a-5"}, activeIDs(t, h))
}

// TestBrowserReleaseASessionOfASubscription drives a real browser through the release of a session
// subscription's held session: the sessions page offers it (WakeTo set), the preview says where the
// wake-up goes, and the run writes the state once the wake-up is in the session.
func TestBrowserReleaseASessionOfASubscription(t *testing.T) {
	tab := newBrowser(t)
	em := sbemu.StartT(t, wakeRoutedTopic(true))
	client, err := azservicebus.NewClientFromConnectionString(em.ConnectionString(), &azservicebus.ClientOptions{RetryOptions: sbtest.FastRetries})
	require.NoError(t, err)
	t.Cleanup(func() { _ = client.Close(sbtest.Context(t)) })
	raw := blockSubscriptionSession(t, client, "order-17")
	const path = "events/Subscriptions/billing"
	c, err := New(client, []Entity{{Path: path, SessionConsumer: true, WakeTo: "events"}}, nil)
	require.NoError(t, err)
	s := serve(t, &sbtest.Harness{Em: em, Client: client, Entity: path}, c)

	require.NoError(t, chromedp.Do(tab,
		chromedp.Navigate(s.srv.URL+"/sessions?e="+url.QueryEscape(path)),
		chromedp.WaitVisible(chromedp.ID("sessions")),
	))
	click(t, tab, `tr[data-session="order-17"] button.release`)
	require.NoError(t, chromedp.Do(tab, chromedp.WaitVisible(chromedp.ID("run"))))
	assert.Contains(t, text(t, tab, "#wake-to"), "sbretry-wake-to=events/Subscriptions/billing")
	screenshot(t, tab, "console-release-subscription.png")
	click(t, tab, "#run")
	require.NoError(t, chromedp.Do(tab, chromedp.WaitVisible(chromedp.ID("result-summary"))))
	assert.Equal(t, "Released session order-17 of events/Subscriptions/billing", text(t, tab, "#result-summary"))
	ctx := sbtest.Context(t)
	r, err := client.AcceptSessionForSubscription(ctx, "events", "billing", "order-17", nil)
	require.NoError(t, err)
	defer func() { _ = r.Close(ctx) }()
	state, err := r.GetSessionState(ctx, nil)
	require.NoError(t, err)
	assert.NotEqual(t, raw, state, "the state was written")
}
