package harness

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// installPip installs sp with pip into gen/<name>/pkg (pip --target),
// from the Python index (version, or the latest), or from s.PipSource's
// directory without any index; copies the host's Python (interpreter,
// libraries, standard library) into gen/python; and writes the launcher.
func (s *Store) installPip(ctx context.Context, gen string, sp Spec, version string) (string, error) {
	py := s.Python
	if py == "" {
		p, err := exec.LookPath("python3")
		if err != nil {
			return "", errors.New("python3 is not installed on this host: install python3 and python3-pip to install pip harnesses")
		}
		py = p
	}
	if err := exec.CommandContext(ctx, py, "-m", "pip", "--version").Run(); err != nil {
		return "", errors.New("pip is not installed on this host: install python3-pip to install pip harnesses")
	}
	pkg := filepath.Join(gen, sp.Name, "pkg")
	args := []string{"-m", "pip", "install", "--disable-pip-version-check", "--no-warn-script-location", "--target", pkg}
	if src, ok := s.PipSource[sp.Name]; ok {
		args = append(args, "--no-index", src)
	} else {
		ref := sp.Package
		if version != "" {
			ref += "==" + version
		}
		args = append(args, ref)
	}
	if err := s.run(ctx, gen, nil, py, args...); err != nil {
		if _, local := s.PipSource[sp.Name]; !local {
			return "", fmt.Errorf("this host cannot install %s from a Python index (PyPI or pip's configured index): %w", sp.Package, err)
		}
		return "", err
	}
	// The interpreter itself (python3 on PATH may be a wrapper script, as
	// pyenv's are), its standard library and its version.
	out, err := exec.CommandContext(ctx, py, "-c", "import sys, sysconfig; print(sys.executable); print(sysconfig.get_paths()['stdlib']); print('python%d.%d' % sys.version_info[:2])").Output()
	if err != nil {
		return "", fmt.Errorf("python stdlib: %w", err)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if len(lines) != 3 {
		return "", fmt.Errorf("python stdlib: unexpected answer %q", out)
	}
	py, stdlib, ver := lines[0], lines[1], lines[2]
	if err := s.copyRuntime(gen, "python", py); err != nil {
		return "", err
	}
	// The interpreter finds its standard library beside it: bin/../lib/pythonX.Y.
	if err := copyStdlib(stdlib, filepath.Join(gen, "python", "lib", ver), func(so string) error {
		return s.addLibraries(gen, "python", so)
	}); err != nil {
		return "", err
	}
	version, err = pipVersion(pkg, sp.Package)
	if err != nil {
		return "", err
	}
	launch := fmt.Sprintf("import runpy, sys\nsys.path.insert(0, %q)\nsys.argv[0] = %q\nrunpy.run_path(%q, run_name=\"__main__\")\n",
		MountPath+"/"+sp.Name+"/pkg", sp.Command, MountPath+"/"+sp.Name+"/pkg/bin/"+sp.Command)
	if err := os.WriteFile(filepath.Join(gen, sp.Name, "launch.py"), []byte(launch), 0o644); err != nil {
		return "", err
	}
	rt := MountPath + "/python"
	line := fmt.Sprintf("exec %s/lib/%s --library-path %s/lib %s/bin/%s -s -E %s/%s/launch.py \"$@\"",
		rt, loaderName, rt, rt, filepath.Base(py), MountPath, sp.Name)
	return version, writeLauncher(gen, sp, version, line)
}

// pipVersion reads the installed version from pip's dist-info folder.
func pipVersion(target, pkg string) (string, error) {
	norm := strings.ReplaceAll(pkg, "-", "_")
	ms, _ := filepath.Glob(filepath.Join(target, norm+"-*.dist-info"))
	if len(ms) == 0 {
		return "", fmt.Errorf("pip installed no %s", pkg)
	}
	return strings.TrimSuffix(strings.TrimPrefix(filepath.Base(ms[0]), norm+"-"), ".dist-info"), nil
}

// copyStdlib copies Python's standard library, without site packages,
// its own tests and caches; lib calls addLib for each extension module so
// that the libraries they link (libssl, libffi ...) come along.
func copyStdlib(src, dst string, addLib func(string) error) error {
	skip := map[string]bool{"site-packages": true, "dist-packages": true, "test": true, "__pycache__": true, "idlelib": true, "tkinter": true, "turtledemo": true}
	return filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && skip[d.Name()] {
			return filepath.SkipDir
		}
		rel, _ := filepath.Rel(src, p)
		to := filepath.Join(dst, rel)
		switch {
		case d.IsDir():
			return os.MkdirAll(to, 0o755)
		case d.Type()&fs.ModeSymlink != 0:
			return nil
		}
		if strings.HasSuffix(p, ".so") {
			if err := addLib(p); err != nil {
				return err
			}
		}
		return copyFile(p, to)
	})
}
