package broker

import (
	"container/heap"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/assert"
)

func TestTimelineHeap(t *testing.T) {
	t0 := time.Unix(0, 0)
	var h timelineHeap
	a, b, c := newEntry(nil, "", 0), newEntry(nil, "", 0), newEntry(nil, "", 0)
	h.setDeadline(a, t0.Add(3*time.Second))
	h.setDeadline(b, t0.Add(1*time.Second))
	h.setDeadline(c, t0.Add(2*time.Second))
	h.setDeadline(b, t0.Add(4*time.Second)) // move
	h.setDeadline(c, time.Time{})           // remove
	h.setDeadline(c, time.Time{})           // removing twice is harmless
	assert.Equal(t, int32(-1), c.timeIndex)
	assert.Same(t, a, heap.Pop(&h))
	assert.Same(t, b, heap.Pop(&h))
	assert.Zero(t, h.Len())
}

func TestAvailableHeapOrdersBySequence(t *testing.T) {
	var h availableHeap
	for _, s := range []int64{5, 1, 3} {
		e := newEntry(nil, "", 0)
		e.seq = s
		heap.Push(&h, e)
	}
	var got []int64
	for h.Len() > 0 {
		got = append(got, heap.Pop(&h).(*entry).seq)
	}
	assert.Equal(t, []int64{1, 3, 5}, got)
}

// TestEntryFitsItsSizeClass keeps the entry in the 192-byte size class:
// one is stored per message, and the next class up is 208 bytes (a
// field added in the wrong place took it to 288 once, see entry).
func TestEntryFitsItsSizeClass(t *testing.T) {
	assert.LessOrEqual(t, unsafe.Sizeof(entry{}), uintptr(192))
}
