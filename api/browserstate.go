package api

import "encoding/json"

// BrowserStateVersion is the version of BrowserState this build writes and
// reads.
const BrowserStateVersion = 1

// MaxBrowserStateBytes bounds a BrowserState as JSON, on export and on
// import: a snapshot carries it whole, and a fork of a browser episode
// reads it before its first step. 32 MiB holds a logged-in site's cookies
// and storage many times over; a page that keeps more in IndexedDB is not
// one a snapshot can carry.
const MaxBrowserStateBytes = 32 << 20

// BrowserState is what a browser sandbox's snapshot carries of its
// browser (GET and PUT /browser/state): enough for a fresh browser with a
// fresh profile to put the agent where it was — logged in, the same tabs
// on the same pages, scrolled and typed into as they were.
type BrowserState struct {
	Version int           `json:"version"`
	Cookies []StateCookie `json:"cookies"`
	// Origins holds the storage of each origin shown in a tab: its
	// localStorage and IndexedDB.
	Origins []OriginState `json:"origins"`
	// Tabs in the order they opened.
	Tabs []TabState `json:"tabs"`
	// ActiveTab is the index in Tabs of the tab actions go to.
	ActiveTab int `json:"active_tab"`
	// Skipped lists what the export saw and could not carry, each with its
	// reason (an IndexedDB record holding a Blob, say).
	Skipped []StateSkip `json:"skipped,omitempty"`
}

// StateCookie is one cookie with every field needed to set it again.
type StateCookie struct {
	Name   string `json:"name"`
	Value  string `json:"value"`
	Domain string `json:"domain"`
	Path   string `json:"path"`
	// Expires is in seconds since the Unix epoch; 0 for a session cookie.
	Expires      float64             `json:"expires,omitempty"`
	Session      bool                `json:"session"`
	HTTPOnly     bool                `json:"http_only"`
	Secure       bool                `json:"secure"`
	SameSite     string              `json:"same_site,omitempty"` // Strict, Lax, None
	Priority     string              `json:"priority,omitempty"`
	SourceScheme string              `json:"source_scheme,omitempty"`
	SourcePort   int                 `json:"source_port,omitempty"`
	PartitionKey *CookiePartitionKey `json:"partition_key,omitempty"`
}

// CookiePartitionKey is a partitioned (CHIPS) cookie's partition.
type CookiePartitionKey struct {
	TopLevelSite         string `json:"top_level_site"`
	HasCrossSiteAncestor bool   `json:"has_cross_site_ancestor"`
}

// OriginState is the storage of one origin ("https://example.com").
type OriginState struct {
	Origin       string            `json:"origin"`
	LocalStorage map[string]string `json:"local_storage,omitempty"`
	IndexedDB    []IDBDatabase     `json:"indexed_db,omitempty"`
}

// IDBDatabase is one IndexedDB database of an origin.
type IDBDatabase struct {
	Name    string     `json:"name"`
	Version int64      `json:"version"`
	Stores  []IDBStore `json:"stores"`
}

// IDBStore is one object store with its records.
type IDBStore struct {
	Name string `json:"name"`
	// KeyPath is null (keys out of line), a string or an array of strings.
	KeyPath       json.RawMessage `json:"key_path"`
	AutoIncrement bool            `json:"auto_increment"`
	Indexes       []IDBIndex      `json:"indexes,omitempty"`
	Records       []IDBRecord     `json:"records"`
}

// IDBIndex is one index of an object store.
type IDBIndex struct {
	Name       string          `json:"name"`
	KeyPath    json.RawMessage `json:"key_path"`
	Unique     bool            `json:"unique"`
	MultiEntry bool            `json:"multi_entry"`
}

// IDBRecord is one record: its primary key and value as JSON.
type IDBRecord struct {
	Key   json.RawMessage `json:"key"`
	Value json.RawMessage `json:"value"`
}

// StateSkip is something the export could not carry.
type StateSkip struct {
	// Kind is what was skipped: "indexeddb_record", "indexeddb_database",
	// "form_field".
	Kind     string `json:"kind"`
	Origin   string `json:"origin,omitempty"`
	Database string `json:"database,omitempty"`
	Store    string `json:"store,omitempty"`
	// Key is the record's key where it is JSON, else its description.
	Key json.RawMessage `json:"key,omitempty"`
	// Tab and Selector name a form field.
	Tab      *int   `json:"tab,omitempty"`
	Selector string `json:"selector,omitempty"`
	Reason   string `json:"reason"`
}

// TabState is one tab: where it is, how it got there and what the agent
// did on its page that the page's server does not know.
type TabState struct {
	URL   string `json:"url"`
	Title string `json:"title,omitempty"`
	// History is the tab's session history, oldest first; CurrentIndex is
	// the entry shown (the one with URL).
	History      []HistoryEntry `json:"history"`
	CurrentIndex int            `json:"current_index"`
	Scroll       ScrollPosition `json:"scroll"`
	// Scrolled are elements other than the window that are scrolled.
	Scrolled []ElementScroll `json:"scrolled,omitempty"`
	Fields   []FieldValue    `json:"fields,omitempty"`
	Focus    *FocusState     `json:"focus,omitempty"`
	// SessionStorage is the tab's sessionStorage, by origin.
	SessionStorage map[string]map[string]string `json:"session_storage,omitempty"`
}

// HistoryEntry is one entry of a tab's session history.
type HistoryEntry struct {
	URL   string `json:"url"`
	Title string `json:"title,omitempty"`
}

// ScrollPosition is a scroll offset in CSS pixels.
type ScrollPosition struct {
	X float64 `json:"x"`
	Y float64 `json:"y"`
}

// ElementScroll is the scroll offset of one element.
type ElementScroll struct {
	Selector string  `json:"selector"`
	Left     float64 `json:"left"`
	Top      float64 `json:"top"`
}

// FieldValue is a form field whose value differs from the page's: its
// selector (a CSS path computed in the page) and what it holds.
type FieldValue struct {
	Selector string `json:"selector"`
	// Kind is text (input, textarea), checkbox, radio, select or
	// contenteditable.
	Kind string `json:"kind"`
	// Value is the text of a text field or a contenteditable element.
	Value string `json:"value,omitempty"`
	// Checked is a checkbox's or radio button's state.
	Checked bool `json:"checked,omitempty"`
	// Selected are a select's chosen option values.
	Selected []string `json:"selected,omitempty"`
}

// FocusState is the focused element and its caret or selection.
type FocusState struct {
	Selector       string `json:"selector"`
	SelectionStart *int   `json:"selection_start,omitempty"`
	SelectionEnd   *int   `json:"selection_end,omitempty"`
	// SelectionDirection is forward, backward or none.
	SelectionDirection string `json:"selection_direction,omitempty"`
}
