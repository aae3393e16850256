package fault

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func TestRejectionsAreConsumedOneByOne(t *testing.T) {
	var f Injector
	_, ok := f.TakeSendRejection()
	assert.False(t, ok, "nothing armed by default")

	f.RejectSends(2, "com.microsoft:server-busy")
	for range 2 {
		cond, ok := f.TakeSendRejection()
		require.True(t, ok)
		assert.Equal(t, "com.microsoft:server-busy", cond)
	}
	_, ok = f.TakeSendRejection()
	assert.False(t, ok, "both rejections used up")

	f.RejectSettlements(1, "amqp:internal-error")
	f.RejectSettlements(0, "")
	_, ok = f.TakeSettleRejection()
	assert.False(t, ok, "n = 0 disarms")
}

func TestManagementRejectionMatchesOperation(t *testing.T) {
	var f Injector
	f.RejectManagement(1, "com.microsoft:renew-lock", 503)
	_, ok := f.TakeManagementRejection("com.microsoft:peek-message")
	assert.False(t, ok, "another operation is not affected")
	status, ok := f.TakeManagementRejection("com.microsoft:renew-lock")
	require.True(t, ok)
	assert.Equal(t, 503, status)

	f.RejectManagement(1, "", 500)
	_, ok = f.TakeManagementRejection("anything")
	assert.True(t, ok, "empty operation matches any")
}

func TestHangBlocksUntilEnded(t *testing.T) {
	var f Injector
	assert.True(t, f.WaitHang(), "no hang: returns at once")

	f.HangFor(time.Hour)
	released := make(chan bool)
	go func() { released <- f.WaitHang() }()
	f.EndHang()
	assert.True(t, <-released)

	f.HangFor(time.Hour)
	stop := make(chan struct{})
	close(stop)
	assert.False(t, f.WaitHang(stop), "a closed stop channel wins")
	f.EndHang()
}

func TestRefuseFor(t *testing.T) {
	var f Injector
	assert.False(t, f.Refusing())
	f.RefuseFor(time.Hour)
	assert.True(t, f.Refusing())
	f.RefuseFor(0)
	assert.False(t, f.Refusing())
}
