package memory_test

import (
	"testing"

	"github.com/orchard/orchard/store"
	"github.com/orchard/orchard/store/memory"
	"github.com/orchard/orchard/store/storetest"
)

func TestContract(t *testing.T) {
	storetest.Run(t, func(t *testing.T) store.Store { return memory.New() })
}
