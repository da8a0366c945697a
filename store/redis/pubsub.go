package redis

import (
	"context"
	"errors"
	"net"
	"strconv"
	"sync"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/orchard/orchard/faults"
	"github.com/orchard/orchard/retry"
)

const (
	// healthInterval is how long the subscriber connection may stay silent
	// before it is pinged; a ping unanswered for another interval means the
	// connection is dead (a peer that vanished without a reset) and it is
	// replaced. A killed or restarted Redis resets the connection and is
	// noticed at once; this only bounds the silent case.
	healthInterval = 3 * time.Second

	// subscribeTimeout bounds how long Subscribe waits for Redis to confirm.
	subscribeTimeout = 2 * ioTimeout

	// Reconnection backoff of the subscriber while Redis is unreachable.
	minBackoff = 50 * time.Millisecond
	maxBackoff = time.Second
)

// subscriber multiplexes every subscription of a Store over one Redis
// pub/sub connection, owned by one receive loop.
type subscriber struct {
	s *Store

	// mu guards ps, topics, barriers, seq and broken. Subscription commands
	// are written under it, so their order on the connection is the order
	// of the bookkeeping.
	mu       sync.Mutex
	ps       *goredis.PubSub
	topics   map[string]map[*subscription]struct{} // by channel
	barriers map[string]chan error                 // ping payload → waiting Subscribe
	seq      uint64
	broken   bool // the connection failed; the next message means it is back

	ctx  context.Context // the loop's; canceled by close
	stop context.CancelFunc
	done chan struct{}
}

type subscription struct{ ch chan struct{} }

func newSubscriber(s *Store) *subscriber {
	ctx, cancel := context.WithCancel(context.Background())
	sub := &subscriber{
		s:        s,
		ps:       s.rdb.Subscribe(ctx),
		topics:   map[string]map[*subscription]struct{}{},
		barriers: map[string]chan error{},
		ctx:      ctx,
		stop:     cancel,
		done:     make(chan struct{}),
	}
	go sub.loop()
	return sub
}

func (b *subscriber) close() {
	b.stop()
	b.mu.Lock()
	_ = b.ps.Close() // unblocks the loop's read
	b.mu.Unlock()
	<-b.done
}

// subscribe registers a subscription and returns once Redis has applied
// it: a PING sent after the SUBSCRIBE on the same connection is answered
// only after the SUBSCRIBE took effect.
func (b *subscriber) subscribe(ctx context.Context, channel string) (<-chan struct{}, func(), error) {
	sub := &subscription{ch: make(chan struct{}, 1)}
	var once sync.Once
	cancel := func() { once.Do(func() { b.unsubscribe(channel, sub) }) }

	b.mu.Lock()
	if b.ctx.Err() != nil {
		b.mu.Unlock()
		return nil, nil, b.s.fail(ctx, goredis.ErrClosed)
	}
	set := b.topics[channel]
	if set == nil {
		set = map[*subscription]struct{}{}
		b.topics[channel] = set
	}
	set[sub] = struct{}{}
	var err error
	if len(set) == 1 {
		err = b.ps.Subscribe(ctx, channel)
	}
	b.seq++
	token := "orchard-subscribe-" + strconv.FormatUint(b.seq, 10)
	confirmed := make(chan error, 1)
	if err == nil {
		b.barriers[token] = confirmed
		if err = b.ps.Ping(ctx, token); err != nil {
			delete(b.barriers, token)
		}
	}
	b.mu.Unlock()
	if err != nil {
		cancel()
		return nil, nil, b.s.fail(ctx, err)
	}

	t := time.NewTimer(subscribeTimeout)
	defer t.Stop()
	select {
	case err = <-confirmed:
	case <-t.C:
		err = errors.New("subscribe: no confirmation from redis")
	case <-ctx.Done():
		err = context.Cause(ctx)
	}
	if err != nil {
		b.mu.Lock()
		delete(b.barriers, token)
		b.mu.Unlock()
		cancel()
		return nil, nil, b.s.fail(ctx, err)
	}
	return sub.ch, cancel, nil
}

func (b *subscriber) unsubscribe(channel string, sub *subscription) {
	b.mu.Lock()
	defer b.mu.Unlock()
	set := b.topics[channel]
	delete(set, sub)
	if len(set) > 0 || set == nil {
		return
	}
	delete(b.topics, channel)
	if b.ctx.Err() != nil {
		return
	}
	// Best effort: the channel is forgotten locally either way, so a failed
	// UNSUBSCRIBE is not repeated after a reconnection; until then stray
	// messages find no subscriber.
	ctx, cancel := context.WithTimeout(b.ctx, ioTimeout)
	defer cancel()
	_ = b.ps.Unsubscribe(ctx, channel)
}

// loop receives from the shared connection until close. go-redis redials
// and re-subscribes every channel after a connection error; the loop backs
// off while that fails, and wakes every subscriber once it works again.
func (b *subscriber) loop() {
	defer close(b.done)
	reconnect := retry.NewBackoff(retry.Policy{Initial: minBackoff, Max: maxBackoff})
	pinged := false // a health ping is unanswered
	for {
		b.mu.Lock()
		ps := b.ps
		b.mu.Unlock()
		msg, err := ps.ReceiveTimeout(b.ctx, healthInterval)
		if b.ctx.Err() != nil {
			return
		}
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				if !pinged {
					pinged = true
					b.mu.Lock()
					_ = b.ps.Ping(b.ctx)
					b.mu.Unlock()
					continue
				}
				b.replace(errors.New("health ping unanswered"))
			}
			b.lost(err)
			if reconnect.Wait(b.ctx, err) != nil {
				return
			}
			continue
		}
		reconnect.Reset()
		pinged = false
		b.mu.Lock()
		if b.broken {
			b.broken = false
			b.s.log.Info("redis store: event subscriber reconnected")
			for _, set := range b.topics {
				for sub := range set {
					notify(sub)
				}
			}
		}
		switch m := msg.(type) {
		case *goredis.Message:
			for sub := range b.topics[m.Channel] {
				notify(sub)
			}
		case *goredis.Pong:
			if c, ok := b.barriers[m.Payload]; ok {
				delete(b.barriers, m.Payload)
				c <- nil
			}
		}
		b.mu.Unlock()
	}
}

// lost records a connection failure: pending Subscribes fail, and the next
// message received will wake everyone.
func (b *subscriber) lost(err error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.broken {
		b.s.log.Warn("redis store: event subscriber lost its connection", "err", err)
	}
	b.broken = true
	for token, c := range b.barriers {
		delete(b.barriers, token)
		c <- faults.Wrap(err, faults.CodeStoreUnavailable, faults.Unavailable, faults.Platform, "subscription lost")
	}
}

// replace swaps a silent connection for a new one subscribed to the same
// channels; go-redis has no public way to force its own reconnection.
func (b *subscriber) replace(why error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.ctx.Err() != nil {
		return
	}
	_ = b.ps.Close()
	channels := make([]string, 0, len(b.topics))
	for ch := range b.topics {
		channels = append(channels, ch)
	}
	// Errors surface on the loop's next receive, which redials.
	b.ps = b.s.rdb.Subscribe(b.ctx, channels...)
	if !b.broken {
		b.s.log.Warn("redis store: event connection silent, replacing it", "err", why)
	}
}

func notify(sub *subscription) {
	select {
	case sub.ch <- struct{}{}:
	default: // a value is pending already: coalesce
	}
}
