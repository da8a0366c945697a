package manager

import (
	"fmt"
	"math"
	"strconv"

	"github.com/orchard/orchard/faults"
	"github.com/orchard/orchard/runtime"
)

// ParseEphemeralStorage parses an ephemeral_storage quantity ("10Gi",
// "512Mi", "20G") into bytes, at least runtime.MinEphemeralStorageBytes.
func ParseEphemeralStorage(s string) (int64, error) {
	n, err := ParseMemory(s)
	if err != nil {
		return 0, fmt.Errorf("%q is not a quantity such as \"10Gi\"", s)
	}
	if n < runtime.MinEphemeralStorageBytes {
		return 0, fmt.Errorf("%s is below the minimum of %s", s, formatBytes(runtime.MinEphemeralStorageBytes))
	}
	return n, nil
}

// ephemeralStorage checks the ephemeral_storage of a create, q, asked for
// or the default, against what the runtime can give now.
func (m *Manager) ephemeralStorage(q string, asked bool) (int64, error) {
	what := "ephemeral_storage"
	if !asked {
		what = "the default ephemeral_storage (DEFAULT_EPHEMERAL_STORAGE)"
	}
	n, err := ParseEphemeralStorage(q)
	if err != nil {
		return 0, invalidStorage("%s: %v", what, err)
	}
	if c, ok := m.rt.(runtime.StorageCapacity); ok {
		if max, err := c.MaxEphemeralStorage(); err == nil && n > max {
			return 0, invalidStorage("%s %s is more than this host has free for a sandbox's files (%s)", what, q, formatBytes(max))
		}
	}
	return n, nil
}

// invalidStorage refuses the ephemeral_storage field (the server answers
// it 422, as its own field validations).
func invalidStorage(format string, a ...any) error {
	return faults.Wrap(FieldRefusal{Field: "ephemeral_storage"}, faults.CodeValidation, faults.InvalidRequest, faults.Client,
		fmt.Sprintf(format, a...))
}

// FieldRefusal is the internal cause of a validation error the manager
// gives for a field of a create that it refuses (one the server cannot
// check alone, such as a size the host has no room for): the request was
// well formed, this field's value is not acceptable.
type FieldRefusal struct {
	Field string // the field of api.CreateSandboxRequest, as in JSON
}

func (r FieldRefusal) Error() string { return "refused field " + r.Field }

// formatBytes writes n as a binary quantity ("1.5Gi").
func formatBytes(n int64) string {
	units := []string{"", "Ki", "Mi", "Gi", "Ti", "Pi"}
	v, i := float64(n), 0
	for v >= 1024 && i < len(units)-1 {
		v, i = v/1024, i+1
	}
	// Rounded down: "more than the 9.9Gi free" must not read as 10Gi.
	return strconv.FormatFloat(math.Floor(v*10)/10, 'f', -1, 64) + units[i]
}
