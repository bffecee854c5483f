package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"time"

	inferencev1 "github.com/inference-service/inference-service/clients/go/inference/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
)

func run(ctx context.Context, conn *grpc.ClientConn, o options, args []string) error {
	client := inferencev1.NewInferenceClient(conn)
	switch {
	case args[0] == "models" && len(args) == 1:
		return listModels(ctx, client)
	case args[0] == "admit" && len(args) == 2:
		return admit(ctx, client, args[1])
	case args[0] == "generate" && len(args) == 2:
		return generate(ctx, client, request(o, args[1]))
	case args[0] == "health" && len(args) == 1:
		return health(ctx, conn)
	}
	return fmt.Errorf("unknown command %q (models, admit MODEL, generate TEXT, health)", args)
}

func printJSON(message proto.Message) error {
	text, err := protojson.Marshal(message)
	if err != nil {
		return err
	}
	_, err = fmt.Println(string(text))
	return err
}

func listModels(ctx context.Context, client inferencev1.InferenceClient) error {
	reply, err := client.ListModels(ctx, &inferencev1.ListModelsRequest{})
	if err != nil {
		return err
	}
	return printJSON(reply)
}

func admit(ctx context.Context, client inferencev1.InferenceClient, model string) error {
	reply, err := client.Admit(ctx, &inferencev1.AdmitRequest{
		Model: model, Capability: inferencev1.Capability_CAPABILITY_TEXT,
	})
	if err != nil {
		return err
	}
	return printJSON(reply)
}

func health(ctx context.Context, conn *grpc.ClientConn) error {
	// The empty service name: the server as a whole.
	reply, err := grpc_health_v1.NewHealthClient(conn).Check(ctx, &grpc_health_v1.HealthCheckRequest{})
	if err != nil {
		return err
	}
	fmt.Println(reply.GetStatus())
	if reply.GetStatus() != grpc_health_v1.HealthCheckResponse_SERVING {
		os.Exit(1)
	}
	return nil
}

// request builds a GenerateRequest; unset sampling flags stay unset (the model's defaults).
func request(o options, text string) *inferencev1.GenerateRequest {
	r := &inferencev1.GenerateRequest{Model: o.model}
	if o.chat {
		r.Messages = []*inferencev1.ChatMessage{{Role: "user", Content: text}}
	} else {
		r.Prompt = text
	}
	if o.maxTokens >= 0 {
		r.MaxTokens = proto.Int32(int32(o.maxTokens))
	}
	if o.temperature >= 0 {
		r.Temperature = proto.Float32(float32(o.temperature))
	}
	return r
}

// generate prints the text as it streams, then a summary line on stderr: the time to
// the first text as this client saw it, and the GenerationFinished event (usage, timing).
func generate(ctx context.Context, client inferencev1.InferenceClient, r *inferencev1.GenerateRequest) error {
	sent := time.Now()
	stream, err := client.Generate(ctx, r)
	if err != nil {
		return err
	}
	var firstText time.Duration
	for {
		event, err := stream.Recv()
		if err != nil {
			return err // io.EOF before GenerationFinished is an error too: the stream was cut
		}
		if delta := event.GetDelta(); delta != nil && delta.GetText() != "" {
			if firstText == 0 {
				firstText = time.Since(sent)
			}
			fmt.Print(delta.GetText())
		}
		if finished := event.GetFinished(); finished != nil {
			fmt.Println()
			return summarize(firstText, finished)
		}
	}
}

func summarize(firstText time.Duration, finished *inferencev1.GenerationFinished) error {
	event, err := protojson.Marshal(finished)
	if err != nil {
		return err
	}
	line, err := json.Marshal(map[string]any{
		"clientTtftMs": float64(firstText.Microseconds()) / 1000,
		"finished":     json.RawMessage(event),
	})
	if err != nil {
		return err
	}
	_, err = fmt.Fprintln(os.Stderr, string(line))
	return err
}
