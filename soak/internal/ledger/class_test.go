package ledger

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestPickFollowsTheMix(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	counts := map[Class]int{}
	const n = 200000
	for range n {
		c, fail := IssueMix.Pick(r, 3)
		counts[c]++
		if c == ClassTransient {
			assert.True(t, fail >= 1 && fail <= 3, "fail attempts %d", fail)
		}
	}
	assert.InDelta(t, 0.20, float64(counts[ClassTransient])/n, 0.005)
	assert.InDelta(t, 0.01, float64(counts[ClassAlways])/n, 0.002)
	assert.InDelta(t, 0.005, float64(counts[ClassPermanent])/n, 0.001)
}

func TestPropertiesRoundTrip(t *testing.T) {
	for _, c := range []Class{ClassOK, ClassTransient, ClassAlways, ClassPermanent} {
		got, n, err := FromProperties(Properties(c, 2))
		require.NoError(t, err)
		assert.Equal(t, c, got)
		assert.Equal(t, 2, n)
	}
	_, _, err := FromProperties(map[string]any{PropClass: "bogus"})
	assert.Error(t, err)
	_, _, err = FromProperties(nil)
	assert.Error(t, err)
}

func TestFails(t *testing.T) {
	cases := []struct {
		name    string
		class   Class
		fail    int
		attempt int
		want    bool
	}{
		{"ok never fails", ClassOK, 0, 1, false},
		{"transient fails its first attempts", ClassTransient, 2, 2, true},
		{"transient then succeeds", ClassTransient, 2, 3, false},
		{"always fails late attempts", ClassAlways, 0, 9, true},
		{"permanent fails the first", ClassPermanent, 0, 1, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, Fails(tc.class, tc.fail, tc.attempt))
		})
	}
}
