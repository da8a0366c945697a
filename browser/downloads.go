package browser

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	cdpbrowser "github.com/chromedp/cdproto/browser"

	"github.com/orchard/orchard/api"
)

// Download is a file the browser downloaded or is downloading.
type Download = api.Download

// download is a Download and the GUID Chromium tracks it by.
type download struct {
	Download
	guid string
}

// Download states.
const (
	DownloadInProgress = "in_progress"
	DownloadCompleted  = "completed"
	DownloadCanceled   = "canceled"
)

// Downloads lists the session's downloads in the order they began.
func (s *Session) Downloads() []Download {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Download, len(s.downloads))
	for i, d := range s.downloads {
		out[i] = d.Download
	}
	return out
}

func (s *Session) downloadBegin(ev *cdpbrowser.EventDownloadWillBegin) {
	name := safeName(ev.SuggestedFilename)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.downloads = append(s.downloads, &download{Download: Download{
		Name:  name,
		Path:  filepath.Join(s.opts.DownloadDir, ev.GUID),
		State: DownloadInProgress,
		URL:   ev.URL,
	}, guid: ev.GUID})
}

// downloadProgress updates a download. A completed file is renamed from
// the GUID Chromium saves it under to its suggested name (made unique).
func (s *Session) downloadProgress(ev *cdpbrowser.EventDownloadProgress) {
	s.mu.Lock()
	var d *download
	for _, x := range s.downloads {
		if x.guid == ev.GUID {
			d = x
		}
	}
	if d == nil {
		s.mu.Unlock()
		return
	}
	d.Size = int64(ev.ReceivedBytes)
	switch ev.State {
	case cdpbrowser.DownloadProgressStateCanceled:
		d.State = DownloadCanceled
		s.mu.Unlock()
		return
	case cdpbrowser.DownloadProgressStateCompleted:
	default:
		s.mu.Unlock()
		return
	}
	from := d.Path
	if ev.FilePath != "" {
		from = ev.FilePath
	}
	to := uniquePath(s.opts.DownloadDir, d.Name)
	s.mu.Unlock()

	// The rename is one syscall: fine on the event loop.
	err := os.Rename(from, to)
	s.mu.Lock()
	defer s.mu.Unlock()
	d.State = DownloadCompleted
	if err != nil {
		d.Path = from
		s.log.Warn("rename download", "from", from, "to", to, "error", err)
		return
	}
	d.Path, d.Name = to, filepath.Base(to)
	if fi, err := os.Stat(to); err == nil {
		d.Size = fi.Size()
	}
}

// safeName keeps a suggested file name inside the download folder.
func safeName(name string) string {
	name = filepath.Base(strings.ReplaceAll(name, "\\", "/"))
	if name == "." || name == "/" || name == ".." || name == "" {
		return "download"
	}
	return name
}

// uniquePath returns dir/name, or dir/"stem (n).ext" when that exists.
func uniquePath(dir, name string) string {
	p := filepath.Join(dir, name)
	if _, err := os.Lstat(p); os.IsNotExist(err) {
		return p
	}
	ext := filepath.Ext(name)
	stem := strings.TrimSuffix(name, ext)
	for n := 1; ; n++ {
		p = filepath.Join(dir, fmt.Sprintf("%s (%d)%s", stem, n, ext))
		if _, err := os.Lstat(p); os.IsNotExist(err) {
			return p
		}
	}
}
