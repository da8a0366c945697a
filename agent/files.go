package agent

import (
	"bufio"
	"bytes"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path"
	"slices"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/orchard/orchard/api"
	"github.com/orchard/orchard/faults"
	"github.com/orchard/orchard/internal/jsonstream"
	"github.com/orchard/orchard/internal/upload"
)

const (
	// maxSymlinks is Linux's MAXSYMLINKS: the same paths fail here as in
	// the kernel.
	maxSymlinks = 40
	// maxDownload matches the upload limit (1 GiB of base64 in, 1 GiB of
	// file out): a bigger file belongs in a volume, not in one JSON string.
	maxDownload = 1 << 30
	// listTimeLayout is Orchard's `modified` format: local time, no zone,
	// no fraction (ORCHARD_COMPAT §3.16).
	listTimeLayout = "2006-01-02T15:04:05"
)

var (
	// errPathEscape is a path whose ".." components, directly or through a
	// relative symlink, climb above the root.
	errPathEscape = errors.New("path escapes the root")
	errEmptyPath  = errors.New("empty path")
	errNULInPath  = errors.New("path contains a NUL byte")
)

// resolve maps sandbox path p to a path relative to the root, following
// symlinks the way the kernel would if the root were "/": a relative path
// starts at Config.Cwd, an absolute symlink target starts again at the root
// (so inside a container, where the root is "/", every symlink works as
// usual), and ".." that climbs above the root, in p or in a relative
// symlink, is errPathEscape.
//
// The result is only a fast path: every operation then goes through
// os.Root, which refuses to leave the root even if the tree changes between
// resolve and the operation (a symlink swapped in by the sandbox's user).
func (s *Server) resolve(p string) (string, error) {
	if p == "" {
		return "", errEmptyPath
	}
	if strings.IndexByte(p, 0) >= 0 {
		return "", errNULInPath
	}
	if !strings.HasPrefix(p, "/") {
		p = s.cfg.Cwd + "/" + p
	}
	pending := splitPath(p)
	var real []string // resolved components, none of them a symlink
	links := 0
	missing := false // a component does not exist: the rest is lexical
	for len(pending) > 0 {
		c := pending[0]
		pending = pending[1:]
		if c == ".." {
			if len(real) == 0 {
				return "", errPathEscape
			}
			real = real[:len(real)-1]
			missing = false
			continue
		}
		real = append(real, c)
		if missing {
			continue
		}
		rel := strings.Join(real, "/")
		fi, err := s.root.Lstat(rel)
		if err != nil {
			if isRootEscape(err) {
				return "", err
			}
			// Missing, not a directory, no permission: the operation
			// reports it on the path as the user gave it.
			missing = true
			continue
		}
		if fi.Mode()&fs.ModeSymlink == 0 {
			continue
		}
		if links++; links > maxSymlinks {
			return "", syscall.ELOOP
		}
		target, err := s.root.Readlink(rel)
		if err != nil {
			return "", err
		}
		real = real[:len(real)-1]
		if strings.HasPrefix(target, "/") {
			real = real[:0]
		}
		pending = append(splitPath(target), pending...)
	}
	if len(real) == 0 {
		return ".", nil
	}
	return strings.Join(real, "/"), nil
}

// splitPath splits p into its components without empty and "." ones.
func splitPath(p string) []string {
	parts := strings.Split(p, "/")
	out := parts[:0]
	for _, c := range parts {
		if c != "" && c != "." {
			out = append(out, c)
		}
	}
	return out
}

// isRootEscape reports os.Root's refusal to leave the root. os exports no
// sentinel for it, so its message is matched.
func isRootEscape(err error) bool {
	return err != nil && strings.Contains(err.Error(), "path escapes from parent")
}

// fileFault classifies err from an operation on the user's path p;
// notFound is the answer when p does not exist.
func fileFault(err error, p string, notFound *faults.Error) error {
	switch {
	case errors.Is(err, errPathEscape), isRootEscape(err):
		return faults.Wrap(err, faults.CodePathEscape, faults.InvalidRequest, faults.Client, "Path escapes the sandbox root: "+p)
	case errors.Is(err, errEmptyPath), errors.Is(err, errNULInPath), errors.Is(err, syscall.ENAMETOOLONG):
		return faults.Wrap(err, faults.CodeValidation, faults.InvalidRequest, faults.Client, "Invalid path: "+p)
	case errors.Is(err, fs.ErrNotExist), errors.Is(err, syscall.ENOTDIR):
		notFound.Err = err
		return notFound
	case errors.Is(err, syscall.ELOOP):
		return faults.Wrap(err, faults.CodeSymlinkLoop, faults.InvalidRequest, faults.Client, "Too many levels of symbolic links: "+p)
	case errors.Is(err, syscall.EROFS):
		e := readOnly(p)
		e.Err = err
		return e
	case errors.Is(err, fs.ErrPermission):
		return faults.Wrap(err, faults.CodeFilePermission, faults.PermissionDenied, faults.Client, "Permission denied: "+p)
	}
	return faults.Wrap(err, faults.CodeFileIO, faults.Internal, faults.Sandbox, "File operation failed: "+p)
}

func fileNotFound(p string) *faults.Error {
	return faults.New(faults.CodeFileNotFound, faults.NotFound, faults.Client, "File not found: "+p)
}

func pathNotFound(p string) *faults.Error {
	return faults.New(faults.CodePathNotFound, faults.NotFound, faults.Client, "Path not found: "+p)
}

func isDirectory(p string) *faults.Error {
	return faults.New(faults.CodeIsDirectory, faults.InvalidRequest, faults.Client, "Path is a directory: "+p)
}

// parseMode parses an octal mode such as "0755". ok is false for "".
func parseMode(s string) (mode fs.FileMode, ok bool, err error) {
	if s == "" {
		return 0, false, nil
	}
	n, err := strconv.ParseUint(strings.TrimPrefix(s, "0o"), 8, 32)
	if err != nil || n > 0o7777 {
		return 0, false, faults.Newf(faults.CodeValidation, faults.InvalidRequest, faults.Client, "invalid mode %q: want octal like \"0755\"", s)
	}
	mode = fs.FileMode(n & 0o777)
	if n&0o4000 != 0 {
		mode |= fs.ModeSetuid
	}
	if n&0o2000 != 0 {
		mode |= fs.ModeSetgid
	}
	if n&0o1000 != 0 {
		mode |= fs.ModeSticky
	}
	return mode, true, nil
}

// handleUpload writes a file from an UploadRequest as its body arrives:
// the base64 content is decoded into the file while it streams, so a file
// of hundreds of megabytes never sits in the agent's memory (the sandbox's
// memory). The server sends the path first; content that comes before its
// path is held in memory until the path arrives.
//
// Nothing is written in place: the file appears, by rename, only once the
// whole body has been read and found valid. A body that breaks off (the
// server gave up on the upload) leaves nothing behind. Whatever fails, the
// body is read to its end before the answer, so that the sender, still
// writing it, always gets the answer rather than a broken pipe.
func (s *Server) handleUpload(w http.ResponseWriter, r *http.Request) error {
	var (
		up      *pendingUpload // the file being written, once the path is known
		held    *bytes.Buffer  // decoded content that came before the path
		size    int64
		failure error // the first failure of the file or the content
	)
	defer func() {
		if up != nil {
			up.abort()
		}
	}()
	jr := jsonstream.Reader{Stream: "content", Keep: []string{"path", "mode"}, MaxValue: maxUploadField,
		OnStream: func(before []jsonstream.Member, content io.Reader) error {
			p, known := jsonstream.StringMember(before, "path")
			switch {
			case known && p == "":
				return nil // refused below, before anything is written
			case !known:
				held = new(bytes.Buffer)
				_, failure = upload.Decode(held, content)
				return nil
			}
			if up, failure = s.openUpload(p); failure != nil {
				return nil
			}
			size, failure = upload.Decode(up.f, content)
			return nil
		}}
	body := http.MaxBytesReader(w, r.Body, maxUploadBody)
	res, err := jr.Read(body)
	if err == nil {
		_, err = io.Copy(io.Discard, body)
	}
	var tooBig *http.MaxBytesError
	switch {
	case errors.As(err, &tooBig):
		return faults.Wrap(err, faults.CodeTooLarge, faults.TooLarge, faults.Client, fmt.Sprintf("request body exceeds %d bytes", tooBig.Limit))
	case err != nil:
		return faults.Wrap(err, faults.CodeInvalidJSON, faults.InvalidRequest, faults.Client, "invalid JSON body: "+err.Error())
	case res.Kind != jsonstream.Object:
		return faults.New(faults.CodeInvalidJSON, faults.InvalidRequest, faults.Client, "invalid JSON body: want an object")
	case res.Duplicate != "":
		return faults.New(faults.CodeValidation, faults.InvalidRequest, faults.Client, res.Duplicate+" is given twice")
	}
	var req struct {
		path, content bool
		p, mode       string
	}
	for _, m := range res.Members {
		var v string
		switch {
		case m.Kind == jsonstream.Null:
			// As if absent, as decoding into the struct had it.
		case m.Kind != jsonstream.String:
			return faults.Newf(faults.CodeInvalidJSON, faults.InvalidRequest, faults.Client, "invalid JSON body: %s must be a string", m.Name)
		case m.TooLong:
			return faults.Newf(faults.CodeValidation, faults.InvalidRequest, faults.Client, "%s is longer than %d bytes", m.Name, maxUploadField)
		case strings.EqualFold(m.Name, "content"):
			req.content = true
		case json.Unmarshal(m.Value, &v) != nil:
			return faults.Newf(faults.CodeInvalidJSON, faults.InvalidRequest, faults.Client, "invalid JSON body: %s must be a string", m.Name)
		case strings.EqualFold(m.Name, "path"):
			req.path, req.p = true, v
		default:
			req.mode = v
		}
	}
	if !req.path || req.p == "" {
		return faults.New(faults.CodeValidation, faults.InvalidRequest, faults.Client, "path is required")
	}
	if !req.content {
		return faults.New(faults.CodeValidation, faults.InvalidRequest, faults.Client, "content is required")
	}
	// Checked last because the mode may follow the content: a bad one
	// may leave the parents the upload created, never the file.
	mode, explicit, err := parseMode(req.mode)
	if err != nil {
		return err
	}
	if held != nil && failure == nil {
		if up, failure = s.openUpload(req.p); failure == nil {
			size, failure = io.Copy(upload.Writer(up.f), held) // decoded already
		}
	}
	if failure != nil {
		var we upload.WriteError
		if errors.As(failure, &we) {
			return fileFault(fmt.Errorf("upload %s: write: %w", req.p, we.Err), req.p, fileNotFound(req.p))
		}
		return failure
	}
	if err := up.commit(mode, explicit); err != nil {
		return err
	}
	up = nil
	writeJSON(w, http.StatusOK, api.UploadResult{Success: true, Path: req.p, Size: size})
	return nil
}

// pendingUpload is a file being uploaded: a temporary file in the target's
// directory, renamed over the target once complete, so that readers never
// see half a file.
type pendingUpload struct {
	s        *Server
	p        string // the path as the user gave it
	rel, tmp string // the target and the temporary file, relative to the root
	f        *os.File
	// Of the file replaced: its mode, owner and group; owner is nil for a
	// new file.
	oldMode fs.FileMode
	owner   *uint32
	group   uint32
}

// openUpload prepares to write sandbox path p: parents are created and the
// temporary file opened.
func (s *Server) openUpload(p string) (*pendingUpload, error) {
	rel, err := s.resolve(p)
	if err != nil {
		return nil, fileFault(err, p, fileNotFound(p))
	}
	if rel == "." {
		return nil, isDirectory(p)
	}
	if s.readOnly(rel) {
		return nil, readOnly(p)
	}
	dir := path.Dir(rel)
	if err := s.root.MkdirAll(dir, 0o755); err != nil {
		if errors.Is(err, syscall.ENOTDIR) || errors.Is(err, fs.ErrExist) {
			return nil, faults.Wrap(err, faults.CodeNotDirectory, faults.InvalidRequest, faults.Client, "Parent is not a directory: "+p)
		}
		return nil, fileFault(fmt.Errorf("upload %s: create parents: %w", p, err), p, fileNotFound(p))
	}
	u := &pendingUpload{s: s, p: p, rel: rel}
	if fi, err := s.root.Stat(rel); err == nil {
		if fi.IsDir() {
			return nil, isDirectory(p)
		}
		if !fi.Mode().IsRegular() {
			// The rename would replace the node itself: a FIFO, a socket
			// or /dev/null would become a plain file.
			return nil, faults.New(faults.CodeNotRegular, faults.InvalidRequest, faults.Client, "Not a regular file: "+p)
		}
		u.oldMode = fi.Mode() & (fs.ModePerm | fs.ModeSetuid | fs.ModeSetgid | fs.ModeSticky)
		if st, ok := fi.Sys().(*syscall.Stat_t); ok {
			u.owner = &st.Uid // with st.Gid below
			u.group = st.Gid
		}
	}
	u.tmp = path.Join(dir, ".orchard-upload-"+rand.Text())
	u.f, err = s.root.OpenFile(u.tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o666)
	if err != nil {
		return nil, fileFault(fmt.Errorf("upload %s: create temp: %w", p, err), p, fileNotFound(p))
	}
	return u, nil
}

// commit gives the written file its owner and mode and renames it over
// the target. Without an explicit mode, a replaced file keeps its mode and
// a new one gets 0666 less umask; a replaced file keeps its owner and
// group either way.
func (u *pendingUpload) commit(mode fs.FileMode, explicit bool) error {
	p := u.p
	if !explicit && u.owner != nil {
		mode, explicit = u.oldMode, true
	}
	if u.owner != nil {
		// The file that replaces another keeps its owner, as a write in
		// place would: a user's file must not become the agent's. Before
		// the chmod, since a chown clears set-id bits. An agent that may
		// not chown (not root) leaves the new file its own.
		if err := u.f.Chown(int(*u.owner), int(u.group)); err != nil && !errors.Is(err, syscall.EPERM) {
			return fileFault(fmt.Errorf("upload %s: chown: %w", p, err), p, fileNotFound(p))
		}
	}
	if explicit {
		// fchmod, unlike the open mode, is not cut by the umask.
		if err := u.f.Chmod(mode); err != nil {
			return fileFault(fmt.Errorf("upload %s: chmod: %w", p, err), p, fileNotFound(p))
		}
	}
	if err := u.f.Close(); err != nil {
		return fileFault(fmt.Errorf("upload %s: close: %w", p, err), p, fileNotFound(p))
	}
	u.f = nil
	if err := u.s.root.Rename(u.tmp, u.rel); err != nil {
		return fileFault(fmt.Errorf("upload %s: rename: %w", p, err), p, fileNotFound(p))
	}
	u.tmp = ""
	return nil
}

// abort drops what was written.
func (u *pendingUpload) abort() {
	if u.f != nil {
		u.f.Close()
	}
	if u.tmp != "" {
		_ = u.s.root.Remove(u.tmp)
	}
}

// readOnly reports whether nothing can be written at root-relative path
// rel: it, or the nearest of its parents that exists, is on a read-only
// mount (the agent's own binary is one, bind-mounted read-only; so is
// /proc/sys in every sandbox) or on procfs or sysfs, which take no new
// files. An upload there could only fail, and would fail confusingly: a
// create in procfs is "no such file", a rename over a mount point "busy".
func (s *Server) readOnly(rel string) bool {
	for p := rel; ; p = path.Dir(p) {
		f, err := s.root.OpenFile(p, unix.O_PATH, 0)
		if err != nil {
			if p == "." {
				return false
			}
			continue
		}
		var st unix.Statfs_t
		err = unix.Fstatfs(int(f.Fd()), &st)
		f.Close()
		return err == nil && (st.Flags&unix.ST_RDONLY != 0 || st.Type == unix.PROC_SUPER_MAGIC || st.Type == unix.SYSFS_MAGIC)
	}
}

func readOnly(p string) *faults.Error {
	return faults.New(faults.CodeReadOnly, faults.PermissionDenied, faults.Client, "Read-only path: "+p)
}

func (s *Server) handleDownload(w http.ResponseWriter, r *http.Request) error {
	p := r.URL.Query().Get("path")
	if p == "" {
		return faults.New(faults.CodeValidation, faults.InvalidRequest, faults.Client, "path is required")
	}
	f, _, err := s.openForDownload(p)
	if err != nil {
		return err
	}
	defer f.Close()

	// The body is written as it is encoded: a large file never sits in
	// memory twice (raw and base64). size is written last, counted.
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	bw := bufio.NewWriterSize(w, 64<<10)
	name, _ := json.Marshal(p)
	bw.WriteString(`{"path":`)
	bw.Write(name)
	bw.WriteString(`,"content":"`)
	enc := base64.NewEncoder(base64.StdEncoding, bw)
	// Read to EOF, as Orchard's open().read() does, not to the stat size:
	// procfs and other pseudo files report 0 (or a page) whatever they
	// hold. A file that grows past the limit while it is read fails.
	n, err := io.Copy(enc, io.LimitReader(f, maxDownload+1))
	if err == nil && n > maxDownload {
		err = fmt.Errorf("file grew past the download limit of %d bytes", maxDownload)
	}
	if err == nil {
		err = enc.Close()
	}
	if err == nil {
		_, err = fmt.Fprintf(bw, `","size":%d}`+"\n", n)
	}
	if err == nil {
		err = bw.Flush()
	}
	if err != nil {
		// Too late for an error body: break the connection so the client
		// sees a failed transfer rather than a short file.
		s.log.Warn("download aborted", "path", p, "err", err)
		panic(http.ErrAbortHandler)
	}
	return nil
}

// openForDownload opens sandbox path p, a regular file, for reading and
// returns its stat size (0 for most pseudo files, whatever they hold).
func (s *Server) openForDownload(p string) (*os.File, int64, error) {
	rel, err := s.resolve(p)
	if err != nil {
		return nil, 0, fileFault(err, p, fileNotFound(p))
	}
	// O_NONBLOCK: opening a FIFO must not hang the request; it is refused
	// below like every non-regular file.
	f, err := s.root.OpenFile(rel, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, 0, fileFault(fmt.Errorf("download %s: %w", p, err), p, fileNotFound(p))
	}
	fi, err := f.Stat()
	switch {
	case err != nil:
		f.Close()
		return nil, 0, fileFault(fmt.Errorf("download %s: stat: %w", p, err), p, fileNotFound(p))
	case fi.IsDir():
		f.Close()
		return nil, 0, isDirectory(p)
	case !fi.Mode().IsRegular():
		f.Close()
		return nil, 0, faults.New(faults.CodeNotRegular, faults.InvalidRequest, faults.Client, "Not a regular file: "+p)
	case fi.Size() > maxDownload:
		f.Close()
		return nil, 0, faults.Newf(faults.CodeTooLarge, faults.TooLarge, faults.Client, "File too large to download: %s (%d bytes, limit %d)", p, fi.Size(), maxDownload)
	}
	return f, fi.Size(), nil
}

func (s *Server) handleList(w http.ResponseWriter, r *http.Request) error {
	p := r.URL.Query().Get("path")
	if p == "" {
		p = s.cfg.Cwd
	}
	list, err := s.list(p)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, list)
	return nil
}

// list describes the direct children of sandbox directory p
// (ORCHARD_COMPAT §3.16). A symlink that is dangling or leads out of the
// root is listed as the link itself (a file, its own size) instead of
// failing the whole listing as Orchard does.
func (s *Server) list(p string) (api.FileList, error) {
	rel, err := s.resolve(p)
	if err != nil {
		return api.FileList{}, fileFault(err, p, pathNotFound(p))
	}
	d, err := s.root.OpenFile(rel, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return api.FileList{}, fileFault(fmt.Errorf("list %s: %w", p, err), p, pathNotFound(p))
	}
	defer d.Close()
	fi, err := d.Stat()
	if err != nil {
		return api.FileList{}, fileFault(fmt.Errorf("list %s: stat: %w", p, err), p, pathNotFound(p))
	}
	if !fi.IsDir() {
		return api.FileList{}, faults.New(faults.CodeNotDirectory, faults.InvalidRequest, faults.Client, "Not a directory: "+p)
	}
	// An error part way (permission on an entry) keeps what was read, as
	// Orchard does.
	entries, err := d.ReadDir(-1)
	if err != nil && len(entries) == 0 {
		return api.FileList{}, fileFault(fmt.Errorf("list %s: read: %w", p, err), p, pathNotFound(p))
	}
	files := make([]api.FileEntry, 0, len(entries))
	for _, e := range entries {
		info, err := e.Info()
		if err != nil {
			continue // removed since it was read
		}
		if info.Mode()&fs.ModeSymlink != 0 {
			if t, err := s.statRel(path.Join(rel, e.Name())); err == nil {
				info = t
			}
		}
		typ := "file"
		if info.IsDir() {
			typ = "directory"
		}
		mod := info.ModTime().Local().Format(listTimeLayout)
		files = append(files, api.FileEntry{Name: e.Name(), Type: typ, Size: info.Size(), Modified: &mod})
	}
	slices.SortFunc(files, func(a, b api.FileEntry) int { return strings.Compare(a.Name, b.Name) })
	return api.FileList{Path: p, Files: files}, nil
}

// statRel stats a root-relative path, following symlinks within the root.
func (s *Server) statRel(rel string) (fs.FileInfo, error) {
	r, err := s.resolve("/" + rel)
	if err != nil {
		return nil, err
	}
	return s.root.Stat(r)
}
