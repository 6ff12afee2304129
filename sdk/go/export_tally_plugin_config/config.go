//go:build wasip1

// Package export_tally_plugin_config is a period plugin's `configure`
// export (`tally:plugin/config@0.2.0`; the generated bindings call it): it
// configures the plugin tally/periods.Export registered.
package export_tally_plugin_config

import (
	witTypes "go.bytecodealliance.org/pkg/wit/types"

	"tally/periods"
)

// Configure configures the plugin with the job's `[plugin_config]` as JSON.
func Configure(config string) witTypes.Result[witTypes.Unit, string] {
	if err := periods.Configure(config); err != nil {
		return witTypes.Err[witTypes.Unit, string](err.Error())
	}
	return witTypes.Ok[witTypes.Unit, string](witTypes.Unit{})
}
