// A test MCP server on mcp-go (github.com/mark3labs/mcp-go): the tools of the package tools, over stdio, or
// streamable HTTP at /mcp with --http HOST:PORT.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"log"

	"github.com/mark3labs/mcp-go/mcp"
	"github.com/mark3labs/mcp-go/server"

	"mcp-token-otel.test/peers/tools"
)

func readDocument(_ context.Context, req mcp.CallToolRequest) (*mcp.CallToolResult, error) {
	n := tools.DefaultLines
	if lines, ok := req.GetArguments()["lines"].(float64); ok {
		n = int(lines)
	}
	return mcp.NewToolResultText(tools.Document(n)), nil
}

func weather(context.Context, mcp.CallToolRequest) (*mcp.CallToolResult, error) {
	return &mcp.CallToolResult{Content: []mcp.Content{mcp.NewTextContent(tools.WeatherJSON)},
		StructuredContent: json.RawMessage(tools.WeatherJSON)}, nil
}

func fail(context.Context, mcp.CallToolRequest) (*mcp.CallToolResult, error) {
	return mcp.NewToolResultError(tools.FailText), nil
}

func image(context.Context, mcp.CallToolRequest) (*mcp.CallToolResult, error) {
	return &mcp.CallToolResult{Content: []mcp.Content{mcp.NewImageContent(tools.ImagePNG, "image/png")}}, nil
}

func newServer() *server.MCPServer {
	s := server.NewMCPServer("mcp-go-peer", tools.Version, server.WithToolCapabilities(false))
	empty := json.RawMessage(tools.EmptyInput)
	s.AddTool(mcp.NewToolWithRawSchema("read_document", "A long field report, line by line.",
		json.RawMessage(tools.DocumentInput)), readDocument)
	weatherTool := mcp.NewToolWithRawSchema("weather", "Today's weather in Paris.", empty)
	weatherTool.RawOutputSchema = json.RawMessage(tools.WeatherOutput)
	s.AddTool(weatherTool, weather)
	s.AddTool(mcp.NewToolWithRawSchema("fail", "Always fails.", empty), fail)
	s.AddTool(mcp.NewToolWithRawSchema("image", "A small PNG.", empty), image)
	return s
}

func main() {
	addr := flag.String("http", "", "serve streamable HTTP at http://HOST:PORT/mcp instead of stdio")
	flag.Parse()
	s := newServer()
	if *addr == "" {
		if err := server.ServeStdio(s); err != nil {
			log.Fatal(err)
		}
		return
	}
	log.Fatal(server.NewStreamableHTTPServer(s).Start(*addr))
}
