package manager

import (
	"fmt"
	"os"
	goruntime "runtime"
	"strconv"
	"strings"
)

// Limits are the largest cpu and memory a create may ask for.
type Limits struct {
	CPU    float64 // cores
	Memory int64   // bytes
	// CPUFrom and MemoryFrom say where each limit comes from, for the
	// message that refuses a request above it.
	CPUFrom, MemoryFrom string
}

// limits resolves the configured maxima: each one set replaces the host's
// own size, which is the default. A maximum above the host is allowed on
// purpose: cgroup limits may overcommit (a CPU quota above the host's CPUs
// never binds), and clients written for Orchard Env ask for its defaults
// (4 CPUs, 16Gi) whatever the host.
func (c Config) limits() Limits {
	l := Limits{CPU: c.MaxCPU, Memory: c.MaxMemory, CPUFrom: "ORCHARD_MAX_CPU", MemoryFrom: "ORCHARD_MAX_MEMORY"}
	if l.CPU <= 0 {
		l.CPU, l.CPUFrom = float64(goruntime.NumCPU()), "the host's CPUs"
	}
	if l.Memory <= 0 {
		if l.Memory = HostMemory(); l.Memory > 0 {
			l.MemoryFrom = "the host's memory"
		}
	}
	return l
}

// Limits returns the largest cpu and memory a create may ask for. A
// Memory of 0 means unknown (no /proc/meminfo): no limit.
func (m *Manager) Limits() Limits { return m.limits }

// CheckCPU refuses a cpu limit (cores) above l.CPU.
func (l Limits) CheckCPU(cores float64) error {
	if cores > l.CPU {
		return fmt.Errorf("cpu %s is more than this server gives: at most %s (%s)",
			strconv.FormatFloat(cores, 'f', -1, 64), strconv.FormatFloat(l.CPU, 'f', -1, 64), l.CPUFrom)
	}
	return nil
}

// CheckMemory refuses a memory limit (bytes) above l.Memory.
func (l Limits) CheckMemory(bytes int64) error {
	if l.Memory > 0 && bytes > l.Memory {
		return fmt.Errorf("memory %d bytes is more than this server gives: at most %d bytes = %s (%s)",
			bytes, l.Memory, FormatMemory(l.Memory), l.MemoryFrom)
	}
	return nil
}

// FormatMemory writes bytes as the largest binary unit that divides it
// (16Gi, 1536Mi, 1000), the form ParseMemory reads back.
func FormatMemory(bytes int64) string {
	for _, u := range []struct {
		suffix string
		size   int64
	}{{"Pi", 1 << 50}, {"Ti", 1 << 40}, {"Gi", 1 << 30}, {"Mi", 1 << 20}, {"Ki", 1 << 10}} {
		if bytes >= u.size && bytes%u.size == 0 {
			return strconv.FormatInt(bytes/u.size, 10) + u.suffix
		}
	}
	return strconv.FormatInt(bytes, 10)
}

// HostMemory is the host's RAM in bytes (MemTotal), 0 when unknown.
func HostMemory() int64 {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "MemTotal:" {
			kb, _ := strconv.ParseInt(f[1], 10, 64)
			return kb * 1024
		}
	}
	return 0
}
