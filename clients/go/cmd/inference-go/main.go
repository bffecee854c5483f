// Command inference-go calls an inference server through the Go code generated from
// protos/ (package inferencev1), as a Go user of the service would.
//
//	inference-go [flags] models          list the models, as JSON
//	inference-go [flags] admit MODEL     whether the server can serve MODEL, as JSON
//	inference-go [flags] generate TEXT   stream a completion of TEXT: the text on stdout
//	                                     as it arrives, then one JSON line on stderr with
//	                                     the time to first token and the final event
//	inference-go [flags] health          the server's gRPC health status
//
// Flags: -target HOST:PORT, -timeout (every call's deadline), -tls and -ca FILE (TLS:
// the CA that signed the server's certificate; the system's roots without -ca),
// -model, -max-tokens, -temperature, -chat (TEXT as one user turn, with the model's
// chat template). A failed call prints its gRPC status on stderr and exits 2.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"time"

	"google.golang.org/grpc/status"
)

type options struct {
	target      string
	timeout     time.Duration
	tls         bool
	ca          string
	model       string
	maxTokens   int
	temperature float64
	chat        bool
}

func parseFlags() (options, []string) {
	var o options
	flag.StringVar(&o.target, "target", "127.0.0.1:50051", "the server, HOST:PORT")
	flag.DurationVar(&o.timeout, "timeout", 60*time.Second, "deadline of each call")
	flag.BoolVar(&o.tls, "tls", false, "connect with TLS (plaintext without it)")
	flag.StringVar(&o.ca, "ca", "", "TLS: the CA certificate (PEM) that signed the server's")
	flag.StringVar(&o.model, "model", "", "model name (empty: the server's default)")
	flag.IntVar(&o.maxTokens, "max-tokens", -1, "generate: at most this many tokens (-1: the server's default)")
	flag.Float64Var(&o.temperature, "temperature", -1, "generate: sampling temperature (-1: the model's default)")
	flag.BoolVar(&o.chat, "chat", false, "generate: TEXT is a user turn of a chat")
	flag.Parse()
	return o, flag.Args()
}

func main() {
	o, args := parseFlags()
	if len(args) == 0 {
		fail("usage: inference-go [flags] models|admit MODEL|generate TEXT|health")
	}
	conn, err := dial(o)
	if err != nil {
		fail(fmt.Sprintf("connecting to %s: %v", o.target, err))
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), o.timeout)
	defer cancel()
	if err := run(ctx, conn, o, args); err != nil {
		if s, ok := status.FromError(err); ok {
			fmt.Fprintf(os.Stderr, "%s: %s\n", s.Code(), s.Message())
			os.Exit(2)
		}
		fail(err.Error())
	}
}

func fail(message string) {
	fmt.Fprintln(os.Stderr, message)
	os.Exit(1)
}
