module billing-periods-go

go 1.25

require (
	go.bytecodealliance.org/pkg v0.4.0
	tally v0.0.0
)

replace (
	go.bytecodealliance.org/pkg => ../../sdk/go/third_party/pkg
	tally => ../../sdk/go
)
