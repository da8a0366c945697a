package browser

import (
	"context"
	"fmt"
)

// frameInfo is what an observation frame needs to map its screenshot
// pixels back to CSS pixels.
type frameInfo struct {
	id    int64
	tab   *tab
	scale float64 // screenshot pixels per CSS pixel
	// fullPage frames cover the document from its origin; others cover the
	// viewport as it was scrolled.
	fullPage bool
	docs     int64 // the tab's document count when taken
}

// recordFrame registers a new observation of t and returns its id.
func (s *Session) recordFrame(t *tab, scale float64, fullPage bool) int64 {
	id := s.frameSeq.Add(1)
	t.mu.Lock()
	t.lastFrame = id
	docs := t.docs
	t.mu.Unlock()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.frames[id] = frameInfo{id: id, tab: t, scale: scale, fullPage: fullPage, docs: docs}
	s.frameRing = append(s.frameRing, id)
	if len(s.frameRing) > keptFrames {
		delete(s.frames, s.frameRing[0])
		s.frameRing = s.frameRing[1:]
	}
	return id
}

// frameFor picks the frame an action's coordinates refer to: the one it
// names, else the tab's latest. A strict action naming anything but the
// latest observation of the current page is refused.
func (s *Session) frameFor(t *tab, a Action) (frameInfo, error) {
	t.mu.Lock()
	latest, docs := t.lastFrame, t.docs
	t.mu.Unlock()
	s.mu.Lock()
	named, haveNamed := frameInfo{}, false
	if a.Frame != nil {
		named, haveNamed = s.frames[*a.Frame]
	}
	cur, haveCur := s.frames[latest]
	s.mu.Unlock()

	if a.Strict && a.Frame != nil {
		if !haveNamed || named.tab != t || *a.Frame != latest || named.docs != docs {
			return frameInfo{}, errStaleFrame(*a.Frame, latest)
		}
	}
	switch {
	case haveNamed && named.tab == t:
		return named, nil
	case haveCur:
		return cur, nil
	}
	return frameInfo{tab: t, scale: 1}, nil
}

// toViewport maps a point in frame pixels to viewport CSS pixels. For a
// full-page frame it first scrolls the point into view.
func (s *Session) toViewport(ctx context.Context, t *tab, fi frameInfo, x, y float64) (float64, float64, error) {
	sc := fi.scale
	if sc <= 0 {
		sc = 1
	}
	cx, cy := x/sc, y/sc
	if !fi.fullPage {
		return cx, cy, nil
	}
	var pos struct{ X, Y float64 }
	expr := fmt.Sprintf(`(function(x,y){var w=innerWidth,h=innerHeight;
if(x<scrollX||x>=scrollX+w||y<scrollY||y>=scrollY+h){scrollTo({left:x-w/2,top:y-h/2,behavior:'instant'})}
return {X:x-scrollX,Y:y-scrollY}})(%g,%g)`, cx, cy)
	if err := t.evalInto(ctx, expr, false, s.opts.CallTimeout, &pos); err != nil {
		return 0, 0, s.classify(ctx, t, "scroll to point", err)
	}
	return pos.X, pos.Y, nil
}
