package sbemu

import (
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"github.com/sbretry/retry/sbemu/broker"
)

// Routes of the administration API, as the SDK builds them (azservicebus
// v1.11.0 admin/admin_client_*.go; paths are relative to https://<host>/):
//
//	GET          $namespaceinfo
//	GET          $Resources/Queues, $Resources/Topics      ($skip, $top)
//	GET|PUT|DEL  <queue or topic>
//	GET          <topic>/Subscriptions                      ($skip, $top)
//	GET|PUT|DEL  <topic>/Subscriptions/<sub>
//	GET          <topic>/Subscriptions/<sub>/Rules/         ($skip, $top)
//	GET|PUT|DEL  <topic>/Subscriptions/<sub>/Rules/<rule>
//
// A PUT without If-Match creates (201; 409 if the name is taken), one with
// "If-Match: *" updates (200; 404 if missing). GET and DELETE of a missing
// entity answer 404. Errors carry the service's XML body,
// <Error><Code>…</Code><Detail>…</Detail></Error>.

const (
	// maxAdminBody bounds a request body; entity descriptions are small.
	maxAdminBody = 1 << 20
	// defaultPageSize is the page size of listings without $top.
	defaultPageSize = 100
)

// apiError is an error with the HTTP status it is answered with.
type apiError struct {
	status int
	detail string
}

// Error returns the detail, which becomes the <Detail> of the reply.
func (e *apiError) Error() string { return e.detail }

// apiErrorf builds an [apiError]; details name the entity and the reason,
// never a token or key.
func apiErrorf(status int, format string, args ...any) error {
	return &apiError{status: status, detail: fmt.Sprintf(format, args...)}
}

// brokerStatus maps a broker error to an API error.
func brokerStatus(err error) error {
	status := http.StatusInternalServerError
	switch {
	case errors.Is(err, broker.ErrUnknownQueue), errors.Is(err, broker.ErrRuleNotFound):
		status = http.StatusNotFound
	case errors.Is(err, broker.ErrInUse), errors.Is(err, broker.ErrRuleExists):
		status = http.StatusConflict
	case errors.Is(err, broker.ErrInvalidConfig), errors.Is(err, broker.ErrNotSupported):
		status = http.StatusBadRequest
	case errors.Is(err, broker.ErrClosed):
		status = http.StatusServiceUnavailable
	}
	return &apiError{status: status, detail: err.Error()}
}

// serveHTTP authenticates and routes one request.
func (a *adminServer) serveHTTP(w http.ResponseWriter, r *http.Request) {
	if isHealthProbe(r) {
		serveHealth(w, r)
		return
	}
	// AMQP over WebSockets authenticates inside AMQP, on "$cbs"
	// (websocket.go).
	if isWebSocketPath(r) {
		a.serveWebSocket(w, r)
		return
	}
	if a.e.persistent && r.Method != http.MethodGet && r.Method != http.MethodHead {
		dw := &durableWriter{ResponseWriter: w, r: r, b: a.e.broker}
		// Also when the handler wrote nothing and net/http answers 200.
		defer dw.wait()
		w = dw
	}
	granted, err := a.authorize(r)
	if err == nil {
		err = a.route(w, r, granted)
	}
	if err == nil {
		return
	}
	var ae *apiError
	if !errors.As(err, &ae) {
		ae = &apiError{status: http.StatusInternalServerError, detail: err.Error()}
	}
	a.e.log.Info("sbemu: admin request refused", "method", r.Method, "path", r.URL.Path, "status", ae.status, "detail", ae.detail)
	w.Header().Set("Content-Type", "application/xml; charset=utf-8")
	w.WriteHeader(ae.status)
	_, _ = io.WriteString(w, errorBody(ae.status, ae.detail))
}

// errorBody is the service's error document,
// <Error><Code>…</Code><Detail>…</Detail></Error>. The detail escapes only
// what XML requires (&, <, >), as the service writes it: clients match
// details by text, such as "Unauthorized access for 'GetSubscription'"
// (the SDK's live test TestAdminClient_LackPermissions_Subscription), and
// encoding/xml would write the apostrophes as &#39;. Characters XML cannot
// hold become U+FFFD.
func errorBody(status int, detail string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "<Error><Code>%d</Code><Detail>", status)
	for _, r := range detail {
		switch {
		case r == '&':
			b.WriteString("&amp;")
		case r == '<':
			b.WriteString("&lt;")
		case r == '>':
			b.WriteString("&gt;")
		case r == '\t', r == '\n', r == '\r', r >= 0x20 && r < 0xD800, r >= 0xE000 && r < 0xFFFE, r >= 0x10000 && r <= 0x10FFFF:
			b.WriteRune(r)
		default:
			b.WriteRune('\uFFFD')
		}
	}
	b.WriteString("</Detail></Error>")
	return b.String()
}

// route dispatches on the path segments, once the request's rights allow
// it (admin_auth.go).
func (a *adminServer) route(w http.ResponseWriter, r *http.Request, granted rights) error {
	parts := strings.Split(strings.Trim(r.URL.Path, "/"), "/")
	if !granted.has(rightManage) {
		if err := a.refuseWithoutManage(r, parts); err != nil {
			return err
		}
	}
	is := func(i int, name string) bool { return len(parts) > i && strings.EqualFold(parts[i], name) }
	method := r.Method
	switch {
	case len(parts) == 1 && is(0, "$namespaceinfo") && method == http.MethodGet:
		return a.namespaceInfo(w, r)
	case len(parts) == 2 && is(0, "$Resources") && is(1, "Queues") && method == http.MethodGet:
		return a.listQueues(w, r)
	case len(parts) == 2 && is(0, "$Resources") && is(1, "Topics") && method == http.MethodGet:
		return a.listTopics(w, r)
	// Any other single segment is an entity name: the SDK puts no prefix
	// before queue and topic names.
	case len(parts) == 1 && parts[0] != "":
		return a.entity(w, r, parts[0])
	case len(parts) == 2 && is(1, "Subscriptions") && method == http.MethodGet:
		return a.listSubscriptions(w, r, parts[0])
	case len(parts) == 3 && is(1, "Subscriptions"):
		return a.subscription(w, r, parts[0], parts[2])
	case len(parts) == 4 && is(1, "Subscriptions") && is(3, "Rules") && method == http.MethodGet:
		return a.listRules(w, r, parts[0], parts[2])
	case len(parts) == 5 && is(1, "Subscriptions") && is(3, "Rules"):
		return a.rule(w, r, parts[0], parts[2], parts[4])
	}
	return apiErrorf(http.StatusNotFound, "sbemu: no administration resource %s %s", method, r.URL.Path)
}

// writeXML answers status with v marshalled.
func writeXML(w http.ResponseWriter, status int, v any) error {
	body, err := xml.Marshal(v)
	if err != nil {
		return err
	}
	kind := "entry"
	if _, isFeed := v.(atomFeed); isFeed {
		kind = "feed"
	}
	w.Header().Set("Content-Type", "application/atom+xml;type="+kind+";charset=utf-8")
	w.WriteHeader(status)
	_, err = w.Write(append([]byte(xml.Header), body...))
	return err
}

// readEntry decodes a PUT body.
func readEntry(w http.ResponseWriter, r *http.Request) (*atomRequest, error) {
	data, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxAdminBody))
	if err != nil {
		return nil, apiErrorf(http.StatusBadRequest, "sbemu: reading the request body: %v", err)
	}
	var req atomRequest
	if err := xml.Unmarshal(data, &req); err != nil {
		return nil, apiErrorf(http.StatusBadRequest, "sbemu: the request body is not an ATOM entry: %v", err)
	}
	return &req, nil
}

// creating tells a create (no If-Match) from an update.
func creating(r *http.Request) bool { return r.Header.Get("If-Match") == "" }

// selfURL is the entry's id and self link.
func selfURL(r *http.Request, path string) string {
	return "https://" + r.Host + "/" + path + "?api-version=" + url.QueryEscape(r.URL.Query().Get("api-version"))
}

// entry wraps a description.
func (a *adminServer) entry(r *http.Request, path, title string, m entityMeta, body any) atomEntry {
	self := selfURL(r, path)
	return atomEntry{
		Xmlns: atomNamespace, ID: self, Title: atomText{Type: "text", Text: title},
		Published: apiTime(m.created), Updated: apiTime(m.updated),
		Author: &atomAuthor{Name: r.Host}, Link: atomLink{Rel: "self", Href: self},
		Content: atomContent{Type: "application/xml", Body: body},
	}
}

// metaFor returns what the server recorded about path; entities configured
// at start date from the start.
func (a *adminServer) metaFor(path string) entityMeta {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.metaLocked(path)
}

// metaLocked is metaFor with a.mu held.
func (a *adminServer) metaLocked(path string) entityMeta {
	if m, ok := a.meta[strings.ToLower(path)]; ok {
		return *m
	}
	return entityMeta{created: a.started, updated: a.started}
}

// touch records a create or update of path; a.mu must be held.
func (a *adminServer) touchLocked(path string, created bool, settings echoedSettings) {
	now := a.e.cfg.Clock.Now()
	key := strings.ToLower(path)
	m, ok := a.meta[key]
	if !ok || created {
		m = &entityMeta{created: now}
		if !created {
			m.created = a.started
		}
		a.meta[key] = m
	}
	m.updated = now
	m.echoedSettings = settings
}

// forgetLocked drops the records of path and everything under it.
func (a *adminServer) forgetLocked(path string) {
	prefix := strings.ToLower(path)
	for k := range a.meta {
		if k == prefix || strings.HasPrefix(k, prefix+"/") {
			delete(a.meta, k)
		}
	}
}

// feed answers a listing with the entries of page ($skip, $top).
func (a *adminServer) feed(w http.ResponseWriter, r *http.Request, title string, entries []atomEntry) error {
	q := r.URL.Query()
	skip, top := 0, defaultPageSize
	if s := q.Get("$skip"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 0 {
			return apiErrorf(http.StatusBadRequest, "sbemu: bad $skip %q", s)
		}
		skip = n
	}
	if s := q.Get("$top"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			return apiErrorf(http.StatusBadRequest, "sbemu: bad $top %q", s)
		}
		top = n
	}
	skip = min(skip, len(entries))
	entries = entries[skip:min(len(entries), skip+top)]
	self := "https://" + r.Host + r.URL.RequestURI()
	return writeXML(w, http.StatusOK, atomFeed{
		Xmlns: atomNamespace, Title: atomText{Type: "text", Text: title}, ID: self,
		Updated: apiTime(a.e.cfg.Clock.Now()), Link: atomLink{Rel: "self", Href: self}, Entries: entries,
	})
}

// namespaceInfo answers GET /$namespaceinfo.
func (a *adminServer) namespaceInfo(w http.ResponseWriter, r *http.Request) error {
	host, _, _ := strings.Cut(r.Host, ":")
	name, _, _ := strings.Cut(host, ".")
	info := namespaceInfo{Xmlns: serviceBusNamespace, CreatedTime: apiTime(a.started), MessagingSKU: "Standard",
		ModifiedTime: apiTime(a.started), Name: name, NamespaceType: "Messaging"}
	return writeXML(w, http.StatusOK, a.entry(r, "$namespaceinfo", name, entityMeta{created: a.started, updated: a.started}, info))
}

// --- queues and topics ---

// listQueues answers GET /$Resources/Queues, which NewListQueuesPager and
// NewListQueuesRuntimePropertiesPager page through with $skip and $top
// (admin_client_queue.go); both read the same entries.
func (a *adminServer) listQueues(w http.ResponseWriter, r *http.Request) error {
	var entries []atomEntry
	for _, name := range a.e.broker.Queues() {
		if qc, ok := a.e.broker.QueueConfig(name); ok {
			entries = append(entries, a.queueEntry(r, qc))
		}
	}
	return a.feed(w, r, "Queues", entries)
}

// listTopics answers GET /$Resources/Topics (admin_client_topic.go).
func (a *adminServer) listTopics(w http.ResponseWriter, r *http.Request) error {
	var entries []atomEntry
	for _, name := range a.e.broker.Topics() {
		if tc, ok := a.e.broker.TopicConfig(name); ok {
			entries = append(entries, a.topicEntry(r, tc))
		}
	}
	return a.feed(w, r, "Topics", entries)
}

// entity serves /<name>, a queue or a topic.
func (a *adminServer) entity(w http.ResponseWriter, r *http.Request, name string) error {
	b := a.e.broker
	switch r.Method {
	case http.MethodGet:
		if qc, ok := b.QueueConfig(name); ok {
			return writeXML(w, http.StatusOK, a.queueEntry(r, qc))
		}
		if tc, ok := b.TopicConfig(name); ok {
			return writeXML(w, http.StatusOK, a.topicEntry(r, tc))
		}
		return apiErrorf(http.StatusNotFound, "sbemu: no queue or topic %q", name)
	case http.MethodPut:
		req, err := readEntry(w, r)
		if err != nil {
			return err
		}
		switch c := req.Content; {
		case c.Queue != nil:
			return a.putQueue(w, r, name, c.Queue)
		case c.Topic != nil:
			return a.putTopic(w, r, name, c.Topic)
		}
		return apiErrorf(http.StatusBadRequest, "sbemu: PUT /%s needs a QueueDescription or a TopicDescription", name)
	case http.MethodDelete:
		a.mu.Lock()
		defer a.mu.Unlock()
		var err error
		switch _, isQueue := b.QueueConfig(name); {
		case isQueue:
			err = b.RemoveQueue(name)
		default:
			if _, isTopic := b.TopicConfig(name); !isTopic {
				return apiErrorf(http.StatusNotFound, "sbemu: no queue or topic %q", name)
			}
			err = b.RemoveTopic(name)
		}
		if err != nil {
			return brokerStatus(err)
		}
		a.forgetLocked(name)
		w.WriteHeader(http.StatusOK)
		return nil
	}
	return apiErrorf(http.StatusMethodNotAllowed, "sbemu: %s is not supported on /%s", r.Method, name)
}

// exists reports whether a queue or topic has the name.
func (a *adminServer) exists(name string) bool {
	_, q := a.e.broker.QueueConfig(name)
	_, t := a.e.broker.TopicConfig(name)
	return q || t
}

// putQueue creates or updates a queue. The SDK sends the whole
// description on both (createOrUpdateQueueImpl), with "If-Match: *" on an
// update, so an update is the full set of changeable settings rather than
// a patch; UserMetadata is kept here because the broker has no use for it.
func (a *adminServer) putQueue(w http.ResponseWriter, r *http.Request, name string, d *queueDescription) error {
	cfg, err := queueConfigFrom(name, d)
	if err != nil {
		return err
	}
	b := a.e.broker
	create := creating(r)
	err = a.change(func() error {
		old, isQueue := b.QueueConfig(name)
		switch {
		case create && a.exists(name):
			return apiErrorf(http.StatusConflict, "sbemu: an entity named %q already exists", name)
		case !create && !isQueue:
			return apiErrorf(http.StatusNotFound, "sbemu: no queue %q", name)
		case !create && old.RequiresSession != cfg.RequiresSession:
			return requiresSessionFixed("Queue")
		}
		settings, err := queueEchoed(d).apply(a.previousLocked(name, create), create)
		if err != nil {
			return err
		}
		if create {
			err = b.AddQueue(cfg)
		} else {
			err = b.UpdateQueue(cfg)
		}
		if err != nil {
			return brokerStatus(err)
		}
		a.touchLocked(name, create, settings)
		return nil
	})
	if err != nil {
		return err
	}
	c, _ := b.QueueConfig(name)
	return writeXML(w, statusFor(create), a.queueEntry(r, c))
}

// putTopic creates or updates a topic, as putQueue does a queue; an update
// keeps the subscriptions (createOrUpdateTopicImpl sends none).
func (a *adminServer) putTopic(w http.ResponseWriter, r *http.Request, name string, d *topicDescription) error {
	cfg, err := topicConfigFrom(name, d)
	if err != nil {
		return err
	}
	b := a.e.broker
	create := creating(r)
	err = a.change(func() error {
		_, isTopic := b.TopicConfig(name)
		switch {
		case create && a.exists(name):
			return apiErrorf(http.StatusConflict, "sbemu: an entity named %q already exists", name)
		case !create && !isTopic:
			return apiErrorf(http.StatusNotFound, "sbemu: no topic %q", name)
		}
		settings, err := topicEchoed(d).apply(a.previousLocked(name, create), create)
		if err != nil {
			return err
		}
		if create {
			err = b.AddTopic(cfg)
		} else {
			err = b.UpdateTopic(cfg)
		}
		if err != nil {
			return brokerStatus(err)
		}
		a.touchLocked(name, create, settings)
		return nil
	})
	if err != nil {
		return err
	}
	c, _ := b.TopicConfig(name)
	return writeXML(w, statusFor(create), a.topicEntry(r, c))
}

// change runs fn with a.mu held, so that checking for an entity and
// creating, changing or removing it is one step for concurrent requests.
func (a *adminServer) change(fn func() error) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	return fn()
}

// statusFor is 201 Created for a create and 200 OK for an update, as the
// service answers; the SDK accepts any status below 400.
func statusFor(create bool) int {
	if create {
		return http.StatusCreated
	}
	return http.StatusOK
}

// requiresSessionFixed refuses an update that changes RequiresSession, in
// Service Bus's words, which the SDK's live tests TestAdminClient_UpdateQueue
// and TestAdminClient_UpdateSubscription look for.
func requiresSessionFixed(kind string) error {
	return apiErrorf(http.StatusBadRequest, "The value for the RequiresSession property of an existing %s cannot be changed. sbemu: choose it when creating the entity", kind)
}

// parseStatus reads an entity's Status: Active (also when absent),
// Disabled, SendDisabled or ReceiveDisabled, which the broker enforces
// (broker/status.go); the statuses only the service sets are refused.
func parseStatus(status *string) (broker.EntityStatus, error) {
	if status == nil {
		return broker.StatusActive, nil
	}
	st, err := broker.ParseEntityStatus(*status)
	if err != nil {
		return "", apiErrorf(http.StatusBadRequest, "sbemu: %v", err)
	}
	return st, nil
}

// statusText reports a status, the zero value as Active.
func statusText(st broker.EntityStatus) *string {
	if st == "" {
		st = broker.StatusActive
	}
	return ptr(string(st))
}

// queueConfigFrom reads a QueueDescription.
func queueConfigFrom(name string, d *queueDescription) (broker.QueueConfig, error) {
	cfg := broker.QueueConfig{Name: name}
	if d.RequiresSession != nil {
		cfg.RequiresSession = *d.RequiresSession
	}
	var err error
	if cfg.Status, err = parseStatus(d.Status); err != nil {
		return cfg, err
	}
	bad := func(err error) error { return apiErrorf(http.StatusBadRequest, "sbemu: queue %q: %v", name, err) }
	// Absent fields keep the broker's zero, which means the Service Bus
	// default. An endless lock is out of range, so it maps just past the
	// maximum and the broker refuses it with its own message; an endless
	// TTL is the broker's "never" (zero).
	if cfg.LockDuration, err = parseAPIDuration("LockDuration", d.LockDuration, 0, broker.MaxLockDuration+1); err != nil {
		return cfg, bad(err)
	}
	if cfg.DefaultTTL, err = parseAPIDuration("DefaultMessageTimeToLive", d.DefaultMessageTimeToLive, 0, 0); err != nil {
		return cfg, bad(err)
	}
	// The window only counts when detection is requested: the SDK echoes
	// the window GetQueue reported (10 minutes) even for a queue without
	// detection, and the broker switches detection on by a positive window.
	if d.RequiresDuplicateDetection != nil && *d.RequiresDuplicateDetection {
		if cfg.DuplicateDetectionWindow, err = parseAPIDuration("DuplicateDetectionHistoryTimeWindow", d.DuplicateDetectionHistoryTimeWindow, defaultDuplicateWindow, maxDuplicateWindow); err != nil {
			return cfg, bad(err)
		}
	}
	// The service refuses a MaxDeliveryCount below 1; the broker would take
	// zero as "the default", so it is refused here.
	if d.MaxDeliveryCount != nil {
		if *d.MaxDeliveryCount < 1 {
			return cfg, bad(fmt.Errorf("MaxDeliveryCount %d is below 1", *d.MaxDeliveryCount))
		}
		cfg.MaxDeliveryCount = int(*d.MaxDeliveryCount)
	}
	if d.DeadLetteringOnMessageExpiration != nil {
		cfg.DeadLetterOnExpiration = *d.DeadLetteringOnMessageExpiration
	}
	if d.MaxMessageSizeInKilobytes != nil && *d.MaxMessageSizeInKilobytes > 0 {
		cfg.MaxMessageSize = int(*d.MaxMessageSizeInKilobytes) * 1024
	}
	// Forwarding targets arrive as names or URLs; the broker checks that
	// they exist and do not loop.
	cfg.ForwardTo = forwardName(d.ForwardTo)
	cfg.ForwardDeadLetteredMessagesTo = forwardName(d.ForwardDeadLetteredMessagesTo)
	return cfg, nil
}

// topicConfigFrom reads a TopicDescription.
func topicConfigFrom(name string, d *topicDescription) (broker.TopicConfig, error) {
	cfg := broker.TopicConfig{Name: name}
	var err error
	if cfg.Status, err = parseStatus(d.Status); err != nil {
		return cfg, err
	}
	bad := func(err error) error { return apiErrorf(http.StatusBadRequest, "sbemu: topic %q: %v", name, err) }
	if cfg.DefaultTTL, err = parseAPIDuration("DefaultMessageTimeToLive", d.DefaultMessageTimeToLive, 0, 0); err != nil {
		return cfg, bad(err)
	}
	if d.RequiresDuplicateDetection != nil && *d.RequiresDuplicateDetection {
		if cfg.DuplicateDetectionWindow, err = parseAPIDuration("DuplicateDetectionHistoryTimeWindow", d.DuplicateDetectionHistoryTimeWindow, defaultDuplicateWindow, maxDuplicateWindow); err != nil {
			return cfg, bad(err)
		}
	}
	if d.MaxMessageSizeInKilobytes != nil && *d.MaxMessageSizeInKilobytes > 0 {
		cfg.MaxMessageSize = int(*d.MaxMessageSizeInKilobytes) * 1024
	}
	return cfg, nil
}

// queueEntry describes a queue with its runtime counts. Every field the
// SDK's newQueueRuntimePropertiesItem parses is written: CountDetails, and
// CreatedAt/UpdatedAt/AccessedAt in RFC 3339 (an empty time fails
// atom.StringToTime). Zero settings are shown with the broker's defaults,
// which are the Service Bus defaults.
func (a *adminServer) queueEntry(r *http.Request, qc broker.QueueConfig) atomEntry {
	var rt broker.Runtime
	if q, ok := a.e.broker.Queue(qc.Name); ok {
		rt = q.Runtime()
	}
	m := a.metaFor(qc.Name)
	window := qc.DuplicateDetectionWindow
	if window <= 0 {
		window = defaultDuplicateWindow
	}
	d := &queueDescription{
		Xmlns: serviceBusNamespace, XmlnsI: xsiNamespace,
		LockDuration:                        ptr(formatISODuration(qc.LockDuration)),
		MaxSizeInMegabytes:                  ptr(m.reportedMaxSize()),
		RequiresDuplicateDetection:          ptr(qc.DuplicateDetectionWindow > 0),
		RequiresSession:                     ptr(qc.RequiresSession),
		DefaultMessageTimeToLive:            ttlString(qc.DefaultTTL),
		DeadLetteringOnMessageExpiration:    ptr(qc.DeadLetterOnExpiration),
		DuplicateDetectionHistoryTimeWindow: ptr(formatISODuration(window)),
		MaxDeliveryCount:                    ptr(int32(qc.MaxDeliveryCount)),
		EnableBatchedOperations:             ptr(!m.unbatched),
		SizeInBytes:                         ptr(rt.SizeInBytes),
		MessageCount:                        ptr(int64(rt.Total())),
		AuthorizationRules:                  m.authRules,
		Status:                              statusText(qc.Status),
		ForwardTo:                           forwardURL(r, qc.ForwardTo, m.forwardScheme),
		CreatedAt:                           apiTime(m.created),
		UpdatedAt:                           apiTime(m.updated),
		AccessedAt:                          apiTime(rt.AccessedAt),
		SupportOrdering:                     ptr(true),
		CountDetails:                        counts(rt),
		AutoDeleteOnIdle:                    m.reportedAutoDelete(),
		EnablePartitioning:                  ptr(m.partitioned),
		ForwardDeadLetteredMessagesTo:       forwardURL(r, qc.ForwardDeadLetteredMessagesTo, m.forwardDeadLetterScheme),
		UserMetadata:                        m.userMetadata,
		MaxMessageSizeInKilobytes:           ptr(int64(qc.MaxMessageSize / 1024)),
	}
	return a.entry(r, qc.Name, qc.Name, m, d)
}

// counts is CountDetails; transfers are synchronous in the emulator, so
// nothing ever waits in a transfer queue.
func counts(rt broker.Runtime) *countDetails {
	return &countDetails{
		ActiveMessageCount:     clampInt32(rt.Active),
		DeadLetterMessageCount: clampInt32(rt.DeadLettered),
		ScheduledMessageCount:  clampInt32(rt.Scheduled),
	}
}

// topicEntry describes a topic. Its CountDetails carry only the scheduled
// count, because a due message leaves the topic for its subscriptions at
// once; SqlFilterCount and CorrelationFilterCount (api-version 2024-05)
// count the rules of every subscription, true and false filters being SQL
// filters as on the service.
func (a *adminServer) topicEntry(r *http.Request, tc broker.TopicConfig) atomEntry {
	var rt broker.Runtime
	if q, ok := a.e.broker.Queue(tc.Name); ok {
		rt = q.Runtime()
	}
	var sqlFilters, correlationFilters int32
	for _, sc := range tc.Subscriptions {
		rules, _ := a.e.broker.Rules(tc.Name, sc.Name)
		for _, rc := range rules {
			if rc.CorrelationFilter != nil {
				correlationFilters++
			} else {
				sqlFilters++
			}
		}
	}
	m := a.metaFor(tc.Name)
	window := tc.DuplicateDetectionWindow
	if window <= 0 {
		window = defaultDuplicateWindow
	}
	size := tc.MaxMessageSize
	if size == 0 {
		size = broker.DefaultMaxMessageSize
	}
	d := &topicDescription{
		Xmlns: serviceBusNamespace, XmlnsI: xsiNamespace,
		DefaultMessageTimeToLive:            ttlString(tc.DefaultTTL),
		MaxSizeInMegabytes:                  ptr(m.reportedMaxSize()),
		RequiresDuplicateDetection:          ptr(tc.DuplicateDetectionWindow > 0),
		DuplicateDetectionHistoryTimeWindow: ptr(formatISODuration(window)),
		EnableBatchedOperations:             ptr(!m.unbatched),
		SizeInBytes:                         ptr(rt.SizeInBytes),
		FilteringMessagesBeforePublishing:   ptr(false),
		AuthorizationRules:                  m.authRules,
		Status:                              statusText(tc.Status),
		UserMetadata:                        m.userMetadata,
		CreatedAt:                           apiTime(m.created),
		UpdatedAt:                           apiTime(m.updated),
		AccessedAt:                          apiTime(rt.AccessedAt),
		SupportOrdering:                     ptr(true),
		CountDetails:                        counts(rt),
		SubscriptionCount:                   ptr(clampInt32(len(tc.Subscriptions))),
		AutoDeleteOnIdle:                    m.reportedAutoDelete(),
		EnablePartitioning:                  ptr(m.partitioned),
		SQLFilterCount:                      ptr(sqlFilters),
		CorrelationFilterCount:              ptr(correlationFilters),
		MaxMessageSizeInKilobytes:           ptr(int64(size / 1024)),
	}
	return a.entry(r, tc.Name, tc.Name, m, d)
}

// durableWriter holds back the answer to a request that may have changed
// entities until the broker's journal has the change on disk
// ([Config.DataDir], durable.go), so a client told "created" finds the
// entity after a crash; if the journal failed it answers 500 instead.
type durableWriter struct {
	http.ResponseWriter
	r      *http.Request
	b      *broker.Broker
	waited bool
	failed bool
}

// wait syncs the journal once, before the first byte of the answer.
func (d *durableWriter) wait() {
	if d.waited {
		return
	}
	d.waited = true
	if err := d.b.Sync(d.r.Context()); err != nil {
		d.failed = true
		http.Error(d.ResponseWriter, "sbemu: "+err.Error(), http.StatusInternalServerError)
	}
}

func (d *durableWriter) WriteHeader(code int) {
	d.wait()
	if !d.failed {
		d.ResponseWriter.WriteHeader(code)
	}
}

func (d *durableWriter) Write(p []byte) (int, error) {
	d.wait()
	if d.failed {
		return len(p), nil // the error answer replaced it
	}
	return d.ResponseWriter.Write(p)
}

// previousLocked is the echoed settings of an entity about to be updated,
// or the zero value for one about to be created; a.mu must be held.
func (a *adminServer) previousLocked(path string, create bool) echoedSettings {
	if create {
		return echoedSettings{}
	}
	return a.metaLocked(path).echoedSettings
}

// queueEchoed, topicEchoed and subscriptionEchoed pick the echoed settings
// out of an entity description (admin_echoed.go).
func queueEchoed(d *queueDescription) echoedRequest {
	return echoedRequest{
		kind: "Queue", userMetadata: d.UserMetadata, autoDeleteOnIdle: d.AutoDeleteOnIdle,
		partitioning: d.EnablePartitioning, maxSizeInMegabytes: d.MaxSizeInMegabytes, batched: d.EnableBatchedOperations,
		forwardTo: d.ForwardTo, forwardDeadLetter: d.ForwardDeadLetteredMessagesTo, authRules: d.AuthorizationRules,
	}
}

func topicEchoed(d *topicDescription) echoedRequest {
	return echoedRequest{
		kind: "Topic", userMetadata: d.UserMetadata, autoDeleteOnIdle: d.AutoDeleteOnIdle,
		partitioning: d.EnablePartitioning, maxSizeInMegabytes: d.MaxSizeInMegabytes, batched: d.EnableBatchedOperations,
		authRules: d.AuthorizationRules,
	}
}

func subscriptionEchoed(d *subscriptionDescription) echoedRequest {
	return echoedRequest{
		kind: "Subscription", userMetadata: d.UserMetadata, autoDeleteOnIdle: d.AutoDeleteOnIdle,
		batched: d.EnableBatchedOperations, forwardTo: d.ForwardTo, forwardDeadLetter: d.ForwardDeadLetteredMessagesTo,
	}
}
