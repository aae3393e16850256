package entitycheck

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// duration reads the ISO 8601 durations the administration API reports
// ("PT1M", "PT30S", "P1DT12H", "PT0.5S"); nil or empty is zero. Years and
// months have no fixed length and are refused.
func duration(s *string) (time.Duration, error) {
	if s == nil || strings.TrimSpace(*s) == "" {
		return 0, nil
	}
	orig := *s
	rest, ok := strings.CutPrefix(strings.ToUpper(strings.TrimSpace(orig)), "P")
	if !ok || rest == "" || rest == "T" {
		return 0, fmt.Errorf("%q is not an ISO 8601 duration", orig)
	}
	var total float64
	inTime := false
	for rest != "" {
		if rest[0] == 'T' {
			inTime, rest = true, rest[1:]
			continue
		}
		i := strings.IndexAny(rest, "WDHMS")
		if i <= 0 {
			return 0, fmt.Errorf("%q is not an ISO 8601 duration", orig)
		}
		n, err := strconv.ParseFloat(rest[:i], 64)
		if err != nil || n < 0 {
			return 0, fmt.Errorf("%q is not an ISO 8601 duration", orig)
		}
		unit := rest[i]
		rest = rest[i+1:]
		switch {
		case unit == 'W' && !inTime:
			total += n * 7 * 86400
		case unit == 'D' && !inTime:
			total += n * 86400
		case unit == 'H' && inTime:
			total += n * 3600
		case unit == 'M' && inTime:
			total += n * 60
		case unit == 'S' && inTime:
			total += n
		default:
			return 0, fmt.Errorf("%q: unit %c is not supported here", orig, unit)
		}
	}
	if total > float64(1<<63-1)/1e9 {
		return time.Duration(1<<63 - 1), nil // TimeSpan.MaxValue and beyond: as good as forever
	}
	return time.Duration(total * float64(time.Second)), nil
}
