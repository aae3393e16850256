package sbemu

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
)

// errDurationTooLong reports a duration beyond time.Duration's range (about
// 292 years). Microsoft's tooling writes TimeSpan.MaxValue ("P10675199D")
// for "never"; the configuration loader reads it that way for TTLs.
var errDurationTooLong = errors.New("duration too long")

// parseISODuration reads an ISO 8601 duration as Microsoft's emulator
// configuration writes them ("PT1M", "PT20S", "P14D", "P1DT12H",
// "PT0.5S"): days, weeks, hours, minutes and seconds (fractional seconds
// allowed). Years and months have no fixed length and are refused, as are
// negative durations and values beyond time.Duration's range.
func parseISODuration(s string) (time.Duration, error) {
	orig := s
	bad := func(why string) error { return fmt.Errorf("%q is not an ISO 8601 duration: %s", orig, why) }
	rest, ok := strings.CutPrefix(strings.ToUpper(strings.TrimSpace(s)), "P")
	if !ok {
		return 0, bad(`it must start with "P", as in "PT1M"`)
	}
	if rest == "" || rest == "T" {
		return 0, bad("no value after P")
	}
	// The value is summed in float64 seconds, because any component may be
	// fractional; it is range-checked before conversion to a Duration.
	var total float64 // seconds
	inTime := false   // after the T: H, M and S are time units
	seen := map[byte]bool{}
	for rest != "" {
		if rest[0] == 'T' {
			if inTime {
				return 0, bad("T appears twice")
			}
			inTime = true
			rest = rest[1:]
			if rest == "" {
				return 0, bad("nothing after T")
			}
			continue
		}
		i := 0
		for i < len(rest) && (rest[i] >= '0' && rest[i] <= '9' || rest[i] == '.' || rest[i] == ',') {
			i++
		}
		if i == 0 || i == len(rest) {
			return 0, bad("expected a number followed by a unit")
		}
		num, unit := strings.ReplaceAll(rest[:i], ",", "."), rest[i]
		rest = rest[i+1:]
		v, err := strconv.ParseFloat(num, 64)
		if err != nil {
			return 0, bad("bad number " + strconv.Quote(num))
		}
		key := unit
		if inTime {
			key = unit + 32 // separate the time-part M (minutes) from the date-part M (months)
		}
		if seen[key] {
			return 0, bad("unit " + string(unit) + " appears twice")
		}
		seen[key] = true
		switch {
		case !inTime && (unit == 'Y' || unit == 'M'):
			return 0, bad("years and months have no fixed length; use days (D)")
		case !inTime && unit == 'W':
			total += v * 7 * 86400
		case !inTime && unit == 'D':
			total += v * 86400
		case inTime && unit == 'H':
			total += v * 3600
		case inTime && unit == 'M':
			total += v * 60
		case inTime && unit == 'S':
			total += v
		default:
			return 0, bad("unknown unit " + string(unit))
		}
	}
	if total*float64(time.Second) > math.MaxInt64 {
		return 0, fmt.Errorf("%w: %q exceeds about 292 years", errDurationTooLong, orig)
	}
	return time.Duration(math.Round(total * float64(time.Second))), nil
}
