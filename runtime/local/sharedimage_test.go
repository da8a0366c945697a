package local

import (
	"archive/tar"
	"context"
	"io"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// Two runtimes on one state directory (replicas on one host) share its
// image cache: pulling the same image on both at once must work on both.
func TestSharedImageCacheConcurrentPulls(t *testing.T) {
	var files []tarEntry
	for i := range 64 {
		files = append(files, tarEntry{name: "data/f" + strings.Repeat("x", i%7) + string(rune('a'+i%26)) + string(rune('a'+i/26)),
			typ: tar.TypeReg, body: strings.Repeat("y", 64<<10)})
	}
	img, err := mutate.AppendLayers(empty.Image, layerOf(t, buildTar(t, files)))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	archive := filepath.Join(dir, "image.tar")
	tag, _ := name.NewTag("orchard/shared:v1")
	if err := tarball.WriteToFile(archive, tag, img); err != nil {
		t.Fatal(err)
	}
	cache := filepath.Join(dir, "images")
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	for round := range 5 {
		stores := make([]*imageStore, 2)
		for i := range stores {
			s, err := newImageStore(filepath.Join(cache, string(rune('a'+round))), []string{dir}, log)
			if err != nil {
				t.Fatal(err)
			}
			stores[i] = s
		}
		var wg sync.WaitGroup
		errs := make([]error, len(stores))
		for i, s := range stores {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, errs[i] = s.resolve(context.Background(), "docker-archive:"+archive)
			}()
		}
		wg.Wait()
		for i, err := range errs {
			if err != nil {
				t.Fatalf("round %d: replica %d: %v", round, i, err)
			}
		}
	}
}
