module github.com/inference-service/inference-service/clients/go

// The oldest versions the committed code builds with: Debian bookworm's packages
// (README.md builds offline with them). With a module proxy, `go mod tidy` adds the
// rest (genproto, go.sum).
go 1.19

require (
	google.golang.org/grpc v1.33.3
	google.golang.org/protobuf v1.28.1
)
