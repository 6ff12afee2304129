// Package host is how the SDK reaches the Tally host: the component's
// imports inside a component (set by export_tally_plugin_aggregator, the
// `process` export), tallytest's in-memory host natively.
package host

// Record is one record for an output.
type Record struct {
	Event uint32
	Key   []byte // nil: no key
	Value []byte
}

// Calls are the host's functions; each is set by the build's host.
type Calls struct {
	GetMany    func(keys [][]byte) [][]byte // nil for a key with no value
	PutMany    func(entries [][2][]byte)
	DeleteMany func(keys [][]byte)
	EmitMany   func(output string, records []Record)
	Log        func(level uint8, message string)
}

// Host is the host this plugin runs against.
var Host Calls
