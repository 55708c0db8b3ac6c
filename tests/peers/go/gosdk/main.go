// A test MCP server on the official Go SDK (github.com/modelcontextprotocol/go-sdk): the tools of the
// package tools, over stdio, or streamable HTTP at /mcp with --http HOST:PORT.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"log"
	"net/http"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"mcp-token-otel.test/peers/tools"
)

func text(s string) []mcp.Content { return []mcp.Content{&mcp.TextContent{Text: s}} }

func readDocument(_ context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
	args := struct {
		Lines *int `json:"lines"`
	}{}
	if len(req.Params.Arguments) > 0 {
		if err := json.Unmarshal(req.Params.Arguments, &args); err != nil {
			return nil, err
		}
	}
	n := tools.DefaultLines
	if args.Lines != nil {
		n = *args.Lines
	}
	return &mcp.CallToolResult{Content: text(tools.Document(n))}, nil
}

func weather(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
	return &mcp.CallToolResult{Content: text(tools.WeatherJSON), StructuredContent: json.RawMessage(tools.WeatherJSON)}, nil
}

func fail(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
	return &mcp.CallToolResult{Content: text(tools.FailText), IsError: true}, nil
}

func image(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
	return &mcp.CallToolResult{Content: []mcp.Content{&mcp.ImageContent{Data: tools.ImageBytes(), MIMEType: "image/png"}}}, nil
}

func newServer() *mcp.Server {
	server := mcp.NewServer(&mcp.Implementation{Name: "go-sdk-peer", Version: tools.Version}, nil)
	server.AddTool(&mcp.Tool{Name: "read_document", Description: "A long field report, line by line.",
		InputSchema: json.RawMessage(tools.DocumentInput)}, readDocument)
	server.AddTool(&mcp.Tool{Name: "weather", Description: "Today's weather in Paris.",
		InputSchema: json.RawMessage(tools.EmptyInput), OutputSchema: json.RawMessage(tools.WeatherOutput)}, weather)
	server.AddTool(&mcp.Tool{Name: "fail", Description: "Always fails.", InputSchema: json.RawMessage(tools.EmptyInput)}, fail)
	server.AddTool(&mcp.Tool{Name: "image", Description: "A small PNG.", InputSchema: json.RawMessage(tools.EmptyInput)}, image)
	return server
}

func main() {
	addr := flag.String("http", "", "serve streamable HTTP at http://HOST:PORT/mcp instead of stdio")
	flag.Parse()
	server := newServer()
	if *addr == "" {
		if err := server.Run(context.Background(), &mcp.StdioTransport{}); err != nil {
			log.Fatal(err)
		}
		return
	}
	mux := http.NewServeMux()
	mux.Handle("/mcp", mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return server }, nil))
	log.Fatal(http.ListenAndServe(*addr, mux))
}
