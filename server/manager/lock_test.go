package manager

import (
	"slices"
	"testing"
	"time"
)

// The sandbox lock grants turns in the order they were taken, skips a
// caller that left the line, and passes on a turn that came as its holder
// left.
func TestSandboxLockOrder(t *testing.T) {
	cases := []struct {
		name  string
		n     int   // turns taken while the lock is held
		leave []int // of those, the ones that leave before their turn
		want  []int // the order the rest get the lock
	}{
		{"fifo", 4, nil, []int{0, 1, 2, 3}},
		{"one leaves", 4, []int{1}, []int{0, 2, 3}},
		{"first and last leave", 5, []int{0, 4}, []int{1, 2, 3}},
		{"all leave", 3, []int{0, 1, 2}, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var l sandboxLock
			first := l.enqueue()
			if !granted(first) {
				t.Fatal("a free lock did not grant the first turn at once")
			}
			turns := make([]chan struct{}, c.n)
			for i := range turns {
				turns[i] = l.enqueue()
			}
			for _, i := range c.leave {
				l.leave(turns[i])
			}
			var got []int
			l.release()
			for range c.n {
				i := -1
				for j, turn := range turns {
					if granted(turn) && !slices.Contains(got, j) && !slices.Contains(c.leave, j) {
						if i >= 0 {
							t.Fatalf("turns %d and %d granted at once", i, j)
						}
						i = j
					}
				}
				if i < 0 {
					break
				}
				got = append(got, i)
				l.release()
			}
			if len(got) != len(c.want) {
				t.Fatalf("order %v, want %v", got, c.want)
			}
			for k := range got {
				if got[k] != c.want[k] {
					t.Fatalf("order %v, want %v", got, c.want)
				}
			}
			// Everyone is done: the lock is free again.
			if !granted(l.enqueue()) {
				t.Error("the lock is still held after the last release")
			}
		})
	}
}

// A caller whose turn came just as it gave up passes the lock on.
func TestSandboxLockLeaveAfterGrant(t *testing.T) {
	var l sandboxLock
	l.enqueue()
	a, b := l.enqueue(), l.enqueue()
	l.release() // a's turn
	l.leave(a)  // a gave up anyway: b's turn
	select {
	case <-b:
	case <-time.After(time.Second):
		t.Fatal("the turn was not passed on")
	}
}

func granted(turn chan struct{}) bool {
	select {
	case <-turn:
		return true
	default:
		return false
	}
}
