package recordings

import (
	"bytes"
	"context"
	"encoding/json"
	"testing"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/array"
	"github.com/apache/arrow-go/v18/arrow/memory"
	"github.com/apache/arrow-go/v18/parquet/file"
	"github.com/apache/arrow-go/v18/parquet/pqarrow"
)

// The parquet export read by Apache Arrow's own Parquet reader — an
// implementation independent of the one that writes it, and the format
// pandas and Hugging Face datasets load through (pyarrow): the Arrow schema
// they will see, and the values.
func TestParquetReadsWithArrow(t *testing.T) {
	t.Parallel()
	s, shots := record(t, "arrow")
	r, err := s.Open("arrow")
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	if _, err := r.Export(context.Background(), FormatParquet, &b); err != nil {
		t.Fatal(err)
	}
	pf, err := file.NewParquetReader(bytes.NewReader(b.Bytes()))
	if err != nil {
		t.Fatal(err)
	}
	fr, err := pqarrow.NewFileReader(pf, pqarrow.ArrowReadProperties{}, memory.DefaultAllocator)
	if err != nil {
		t.Fatal(err)
	}
	tbl, err := fr.ReadTable(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer tbl.Release()

	want := []struct {
		name     string
		typ      arrow.DataType
		nullable bool
	}{
		{"messages", arrow.BinaryTypes.String, false},
		{"images", arrow.ListOfField(arrow.Field{Name: "element", Type: arrow.BinaryTypes.Binary}), false}, // the standard three-level LIST
		{"reward", arrow.PrimitiveTypes.Float64, true},
		{"status", arrow.BinaryTypes.String, false},
		{"metadata", arrow.BinaryTypes.String, false},
	}
	sc := tbl.Schema()
	if sc.NumFields() != len(want) {
		t.Fatalf("schema %v", sc)
	}
	for i, w := range want {
		f := sc.Field(i)
		if f.Name != w.name || !arrow.TypeEqual(f.Type, w.typ) || f.Nullable != w.nullable {
			t.Errorf("column %d: %s %v nullable=%v, want %s %v nullable=%v", i, f.Name, f.Type, f.Nullable, w.name, w.typ, w.nullable)
		}
	}
	if tbl.NumRows() != 1 {
		t.Fatalf("%d rows", tbl.NumRows())
	}
	rec := array.NewTableReader(tbl, 1)
	defer rec.Release()
	if !rec.Next() {
		t.Fatal("no record")
	}
	row := rec.RecordBatch()
	var msgs []ChatMessage
	if err := json.Unmarshal([]byte(row.Column(0).(*array.String).Value(0)), &msgs); err != nil || len(msgs) != 6 || msgs[0].Content != "Find the price" {
		t.Errorf("messages %v: %v", msgs, err)
	}
	images := row.Column(1).(*array.List)
	start, end := images.ValueOffsets(0)
	vals := images.ListValues().(*array.Binary)
	if int(end-start) != len(shots) {
		t.Fatalf("%d images, want %d", end-start, len(shots))
	}
	for i := range shots {
		if !bytes.Equal(vals.Value(int(start)+i), shots[i]) {
			t.Errorf("image %d differs from the recorded screenshot", i)
		}
	}
	if reward := row.Column(2).(*array.Float64); reward.IsNull(0) || reward.Value(0) != 0 {
		t.Errorf("reward %v", reward)
	}
	if status := row.Column(3).(*array.String).Value(0); status != OutcomeEnvError {
		t.Errorf("status %q", status)
	}
	var meta ParquetMetadata
	if err := json.Unmarshal([]byte(row.Column(4).(*array.String).Value(0)), &meta); err != nil || meta.Steps != 3 || meta.RecordingID != "arrow" {
		t.Errorf("metadata %+v: %v", meta, err)
	}
}
