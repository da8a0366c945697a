package api

import "time"

// maxSeconds bounds Seconds: a century, far past any timeout anyone means,
// and far enough from time.Duration's limit (about 292 years) that a slack
// added to it cannot overflow either.
const maxSeconds = 100 * 365 * 24 * 60 * 60

// Seconds turns a wire field counted in seconds into a Duration, saturated
// at a century either way: time.Duration(n)*time.Second wraps past about
// 292 years, and a huge timeout would become a negative one that fires at
// once.
func Seconds(n int) time.Duration {
	return time.Duration(max(-maxSeconds, min(n, maxSeconds))) * time.Second
}
