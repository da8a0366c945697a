package manager

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

// ParseCPU parses a Kubernetes CPU quantity ("4", "0.5", "2000m") into cores.
func ParseCPU(s string) (float64, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return 0, fmt.Errorf("empty cpu quantity")
	}
	mult := 1.0
	if strings.HasSuffix(s, "m") {
		mult, s = 0.001, strings.TrimSuffix(s, "m")
	}
	v, err := strconv.ParseFloat(s, 64)
	if err != nil || v <= 0 || math.IsInf(v, 0) || math.IsNaN(v) {
		return 0, fmt.Errorf("invalid cpu quantity %q", s)
	}
	return v * mult, nil
}

var memSuffixes = []struct {
	suffix string
	mult   float64
}{
	{"Ki", 1 << 10}, {"Mi", 1 << 20}, {"Gi", 1 << 30}, {"Ti", 1 << 40}, {"Pi", 1 << 50},
	{"k", 1e3}, {"K", 1e3}, {"M", 1e6}, {"G", 1e9}, {"T", 1e12}, {"P", 1e15},
}

// ParseMemory parses a Kubernetes memory quantity ("16Gi", "512M", "1048576")
// into bytes: binary suffixes Ki..Pi, decimal k..P, or plain bytes.
func ParseMemory(s string) (int64, error) {
	s = strings.TrimSpace(s)
	mult := 1.0
	for _, m := range memSuffixes {
		if strings.HasSuffix(s, m.suffix) {
			mult, s = m.mult, strings.TrimSuffix(s, m.suffix)
			break
		}
	}
	v, err := strconv.ParseFloat(s, 64)
	if err != nil || v <= 0 || math.IsInf(v, 0) || math.IsNaN(v) || v*mult > math.MaxInt64/2 {
		return 0, fmt.Errorf("invalid memory quantity %q", s)
	}
	return int64(v * mult), nil
}
