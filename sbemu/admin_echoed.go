package sbemu

import (
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// Settings the administration API takes and reports back as Service Bus
// does, though the emulator does not act on them: AutoDeleteOnIdle (no
// entity is ever deleted for being idle), EnablePartitioning and
// MaxSizeInMegabytes (one partition, no size quota), EnableBatchedOperations,
// UserMetadata, and the form in which a forwarding target was written;
// and the entity's authorization rules, which [Config.StrictAuth] does act
// on (admin_authrules.go).
// A client that creates an entity and reads it back, as the SDK's own live
// tests do, sees what it asked for. They live with the admin server's other
// records (entityMeta), not in the broker, so entities from Config or
// Config.json report the defaults.

// minAutoDeleteOnIdle is the shortest AutoDeleteOnIdle Service Bus accepts
// ("The minimum duration is 5 minutes", CreateQueueOptions.AutoDeleteOnIdle
// in the Azure.Messaging.ServiceBus reference).
const minAutoDeleteOnIdle = 5 * time.Minute

// partitionCount is how many partitions Service Bus Standard makes for a
// partitioned entity; each has the requested MaxSizeInMegabytes, so the
// entity reports 16 times it (the SDK's live test testCreateQueue expects
// 16*4096 back for 4096, testTopicCreation 16*2048 for 2048).
const partitionCount = 16

// echoedSettings are the settings of one entity described above, as the
// API reports them. The zero value is an entity created with defaults.
type echoedSettings struct {
	userMetadata *string
	// autoDeleteOnIdle is the ISO 8601 duration reported; empty reports
	// timeSpanMax, "never".
	autoDeleteOnIdle string
	partitioned      bool
	// maxSizeInMegabytes is the size reported (for a partitioned entity,
	// that of all partitions); zero reports the default.
	maxSizeInMegabytes int32
	unbatched          bool // EnableBatchedOperations false
	// forwardScheme and forwardDeadLetterScheme are the URL schemes the
	// forwarding targets were given with; empty reports https.
	forwardScheme, forwardDeadLetterScheme string
	// authRules are a queue's or topic's own authorization rules, as
	// reported (admin_authrules.go).
	authRules []authorizationRuleXML
}

// echoedRequest is what a PUT body says about the echoed settings; nil
// fields were absent.
type echoedRequest struct {
	kind                         string // "Queue", "Topic" or "Subscription", for messages
	userMetadata                 *string
	autoDeleteOnIdle             *string
	partitioning                 *bool
	maxSizeInMegabytes           *int32
	batched                      *bool
	forwardTo, forwardDeadLetter *string
	authRules                    []authorizationRuleXML
}

// apply returns prev (the entity's settings before an update; zero for a
// create) changed by the request, or a 400 error. An absent field keeps
// its value. Partitioning can only be chosen at creation, as on Service
// Bus, which refuses a change with "Partitioning cannot be changed for
// Topic." (the SDK's live test TestAdminClient_UpdateTopic).
func (req echoedRequest) apply(prev echoedSettings, create bool) (echoedSettings, error) {
	s := prev
	s.userMetadata = req.userMetadata
	if req.autoDeleteOnIdle != nil {
		d, err := parseAPIDuration("AutoDeleteOnIdle", req.autoDeleteOnIdle, 0, 0)
		switch {
		case err != nil:
			return prev, apiErrorf(http.StatusBadRequest, "sbemu: %s: %v", req.kind, err)
		case d == 0:
			s.autoDeleteOnIdle = "" // never
		case d < minAutoDeleteOnIdle:
			return prev, apiErrorf(http.StatusBadRequest, "sbemu: %s: AutoDeleteOnIdle %s is below the minimum of 5 minutes", req.kind, *req.autoDeleteOnIdle)
		default:
			s.autoDeleteOnIdle = formatISODuration(d)
		}
	}
	if req.partitioning != nil {
		if !create && *req.partitioning != prev.partitioned {
			return prev, apiErrorf(http.StatusBadRequest, "Partitioning cannot be changed for %s. sbemu: choose it when creating the entity", req.kind)
		}
		s.partitioned = *req.partitioning
	}
	if req.maxSizeInMegabytes != nil {
		size := *req.maxSizeInMegabytes
		switch {
		case size <= 0:
			return prev, apiErrorf(http.StatusBadRequest, "sbemu: %s: MaxSizeInMegabytes %d is not positive", req.kind, size)
		case !s.partitioned:
			s.maxSizeInMegabytes = size
		// An update sends back what a read reported (the whole entity's
		// size); anything else is a new size per partition.
		case !create && size == prev.reportedMaxSize():
		case size > (1<<31-1)/partitionCount:
			return prev, apiErrorf(http.StatusBadRequest, "sbemu: %s: MaxSizeInMegabytes %d is too large", req.kind, size)
		default:
			s.maxSizeInMegabytes = size * partitionCount
		}
	} else if create && s.partitioned {
		s.maxSizeInMegabytes = maxSizeInMegabytes * partitionCount
	}
	if req.batched != nil {
		s.unbatched = !*req.batched
	}
	s.forwardScheme = forwardScheme(req.forwardTo)
	s.forwardDeadLetterScheme = forwardScheme(req.forwardDeadLetter)
	// The SDK sends the whole description on an update too, so the rules
	// given replace the old ones, and none clears them.
	rules, err := normalizeAuthorizationRules(req.kind, req.authRules)
	if err != nil {
		return prev, err
	}
	s.authRules = rules
	return s, nil
}

// reportedMaxSize is MaxSizeInMegabytes as reported.
func (s echoedSettings) reportedMaxSize() int32 {
	if s.maxSizeInMegabytes == 0 {
		return maxSizeInMegabytes
	}
	return s.maxSizeInMegabytes
}

// reportedAutoDelete is AutoDeleteOnIdle as reported.
func (s echoedSettings) reportedAutoDelete() *string {
	if s.autoDeleteOnIdle == "" {
		return ptr(timeSpanMax)
	}
	return ptr(s.autoDeleteOnIdle)
}

// forwardScheme is the scheme of a forwarding target written as an
// absolute URL ("sb", "https"), or empty for a bare entity name.
func forwardScheme(s *string) string {
	if s == nil {
		return ""
	}
	u, err := url.Parse(strings.TrimSpace(*s))
	if err != nil || u.Host == "" {
		return ""
	}
	return strings.ToLower(u.Scheme)
}

// forwardURL reports a forwarding target on the namespace the request was
// made to, with the scheme it was given: Service Bus gives back the https://
// URL it was given (the SDK's live test TestAdminClient_Queue_Forwarding)
// and the sb:// one (TestAdminClient_Forwarding). A bare name is reported
// as an https URL, the form of the namespace's entity addresses.
func forwardURL(r *http.Request, name, scheme string) *string {
	if name == "" {
		return nil
	}
	if scheme == "" {
		scheme = "https"
	}
	return ptr(fmt.Sprintf("%s://%s/%s", scheme, r.Host, name))
}
