package browser

import (
	"bytes"
	"context"
	"image"
	"image/png"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/orchard/orchard/internal/chromium"
	"github.com/orchard/orchard/internal/testing/testenv"
)

// Sessions render the test pages as Chromium does by default, whatever
// the engine and the features they turn off. Each variant is compared
// pixel by pixel with the headless shell as sessions start it.
//
// The whole browser: without shellFonts a textarea and every monospace
// text came out in another font (1 % of form.html's pixels, 5 % of
// fonts.html's), and without the shell's hinting set to the whole
// browser's every line of text came out a few pixels narrower (2.5 % of
// fonts.html's); what remains is frames.html's animated bar caught at
// another moment (up to 0.3 % on a loaded machine). The browsers see only the fonts of
// fonts-dejavu-core, which scripts/dev.sh installs, with the rendering
// settings spelled out (pinFonts): the fonts and fontconfig rules a
// machine happens to have cannot change the outcome. RenderDocument,
// which sessions turn off for faster navigations, must change nothing:
// the pages are loaded one after another in one tab, so that each
// navigation reuses the frame.
func TestRenderAlike(t *testing.T) {
	shell, err := chromium.Find(chromium.HeadlessShell, true)
	testenv.Require(t, "chromium", err == nil, "no chromium-headless-shell (apt-get install chromium-headless-shell)")
	full, err := chromium.Find(chromium.Browser, true)
	testenv.Require(t, "chromium", err == nil, "no chromium (apt-get install chromium)")
	pinFonts(t)
	withRenderDocument := "disable-features=" + strings.Join(slices.DeleteFunc(slices.Clone(disabledFeatures), func(f string) bool { return f == "RenderDocument" }), ",")
	variants := []struct {
		name  string
		exe   string
		flags []string
	}{
		{"headless shell", shell, nil},
		{"whole browser", full, nil},
		{"RenderDocument on", shell, []string{withRenderDocument}},
	}
	pages := []string{"/basic.html", "/form.html", "/long.html", "/shadow.html", "/frames.html", "/wrap.html", "/fonts.html"}
	shots := make([][]image.Image, len(variants))
	for i, v := range variants {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		s, err := Launch(ctx, Options{ExecPath: v.exe, DownloadDir: t.TempDir(), Viewport: Viewport{Width: 800, Height: 600}, ExtraFlags: v.flags})
		if err != nil {
			cancel()
			t.Fatalf("launch %s: %v", v.name, err)
		}
		for _, p := range pages {
			mustDo(t, s, Action{Type: ActNavigate, URL: site.URL + p})
			obs := observe(t, s, ObserveOptions{Screenshot: "png"})
			img, err := png.Decode(bytes.NewReader(obs.Screenshot.Data))
			if err != nil {
				t.Fatal(err)
			}
			shots[i] = append(shots[i], img)
		}
		s.Close()
		cancel()
	}
	for i, v := range variants[1:] {
		for j, p := range pages {
			a, b := shots[0][j], shots[i+1][j]
			if a.Bounds() != b.Bounds() {
				t.Errorf("%s, %s: %v against %v", v.name, p, b.Bounds(), a.Bounds())
				continue
			}
			differ := 0
			r := a.Bounds()
			for y := r.Min.Y; y < r.Max.Y; y++ {
				for x := r.Min.X; x < r.Max.X; x++ {
					ar, ag, ab, _ := a.At(x, y).RGBA()
					br, bg, bb, _ := b.At(x, y).RGBA()
					if absDiff(ar, br) > 0x1000 || absDiff(ag, bg) > 0x1000 || absDiff(ab, bb) > 0x1000 {
						differ++
					}
				}
			}
			share := float64(differ) / float64(r.Dx()*r.Dy())
			t.Logf("%s, %s: %d pixels differ (%.4f %%)", v.name, p, differ, 100*share)
			// frames.html's bar moves: a loaded machine catches it up to
			// 0.3 % apart. Every other page must be drawn alike.
			bound := 0.001
			if p == "/frames.html" {
				bound = 0.005
			}
			if share > bound {
				t.Errorf("%s, %s: %.3f %% of pixels differ from the headless shell's", v.name, p, 100*share)
			}
		}
	}
}

func absDiff(a, b uint32) uint32 {
	if a > b {
		return a - b
	}
	return b - a
}

// coreFonts are the files of Debian's fonts-dejavu-core.
var coreFonts = []string{"DejaVuSans.ttf", "DejaVuSans-Bold.ttf", "DejaVuSansMono.ttf",
	"DejaVuSansMono-Bold.ttf", "DejaVuSerif.ttf", "DejaVuSerif-Bold.ttf"}

// pinFonts points the browsers this test starts at a fontconfig file of
// its own: the core DejaVu fonts and nothing else (a CJK or Arabic font
// that one machine has and another lacks changes which glyphs the two
// engines fall back to), and the rendering settings the whole browser
// takes from fontconfig stated here rather than read from /etc/fonts.
func pinFonts(t *testing.T) {
	dir := t.TempDir()
	fonts := filepath.Join(dir, "fonts")
	if err := os.Mkdir(fonts, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, f := range coreFonts {
		src := filepath.Join("/usr/share/fonts/truetype/dejavu", f)
		_, err := os.Stat(src)
		testenv.Require(t, "fonts", err == nil, "no "+src+" (apt-get install fonts-dejavu-core)")
		if err := os.Symlink(src, filepath.Join(fonts, f)); err != nil {
			t.Fatal(err)
		}
	}
	conf := `<?xml version="1.0"?>
<!DOCTYPE fontconfig SYSTEM "urn:fontconfig:fonts.dtd">
<fontconfig>
  <dir>` + fonts + `</dir>
  <cachedir>` + filepath.Join(dir, "cache") + `</cachedir>
  <include ignore_missing="yes">/etc/fonts/conf.d</include>
  <match target="font">
    <edit name="antialias" mode="assign"><bool>true</bool></edit>
    <edit name="hinting" mode="assign"><bool>true</bool></edit>
    <edit name="hintstyle" mode="assign"><const>hintslight</const></edit>
    <edit name="rgba" mode="assign"><const>none</const></edit>
    <edit name="embeddedbitmap" mode="assign"><bool>false</bool></edit>
  </match>
</fontconfig>
`
	file := filepath.Join(dir, "fonts.conf")
	if err := os.WriteFile(file, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Setenv("FONTCONFIG_FILE", file)
}
