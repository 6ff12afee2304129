module tally

go 1.25

require go.bytecodealliance.org/pkg v0.4.0

replace go.bytecodealliance.org/pkg => ./third_party/pkg
