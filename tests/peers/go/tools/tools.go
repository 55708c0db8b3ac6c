// Package tools holds what the Go test servers answer, byte for byte the same in every server and in the
// Python twin (tests/proxy/servers/twin_server.py), so token figures can be compared across languages.
package tools

import (
	"encoding/base64"
	"fmt"
	"strings"
)

// Version is the serverInfo version every Go test server reports.
const Version = "1.0.0"

// DefaultLines is the document's default length: about 40 KB of text.
const DefaultLines = 600

// Heading starts the document: characters Go's encoding/json escapes (<, >, &) and non-ASCII ones.
const Heading = "# Field report <draft> & notes, café №7"

// WeatherJSON is the structured result, with its keys in the order every server writes them.
const WeatherJSON = `{"city":"Paris","conditions":["sunny","windy"],"humidity":40,"temperature":21.5}`

// FailText is the text of the tool error.
const FailText = "quota exceeded for <tenant> & retry later"

// ImagePNG is a 16x16 RGB gradient, base64 (standard alphabet, padded).
const ImagePNG = "iVBORw0KGgoAAAANSUhEUgAAABAAAAAQCAIAAACQkWg2AAAB9UlEQVR42g3KkaLsQAwA0ODFwcXBxWAxWAwWg8VgMVgMFoPF4OLg4uDi4MP5hNfDBwCgwF+FgvAiqAxvAVRYDMhhDeCErYF02AfohOPpf6WUWl5YKpU3F5SyaCErqxeOsmWRVvZedJRjFgOoT3/VWrG+qSLXRSppXa2y1y2qZN1b1V6PUW3WEwBfBZ/+RkTChZEEV0U23BwlcE/UhkdHG3hOdACqhd6Vnr4QEdMqxEqbkTjtQZp0NLJO5yCfdAHwuzBWXpCfvjKz8KYsxruzBh/J1vjs7IOvyQEgWGSpQigrydM3EVHZTdTlCLGUs4l3uYbElBtAl6JUdUVl0o316buqmh6uFnqmetOrawy9pyaAUbG1GqNtZMK2iz39MDO3M8zTrmbR7R6W0z4Avhbn6hu6kO/sKn6oP/109/ArPZrf3XP4Z3oDCC6x1RCMnUI5DgnTOC2efkVExt0ie3xGtBlfgNxKSs0dUykPTpM8Nd3y8nz6nZktPz3byO/MDtCktL02xXZQM26nNNd2WQtvd7Snf1prvX1H67P9APpeutZ+YDfqJ3eXfmkP67f3jP7J/vRv73303+wDYGgZRx2G46ThPC4ZoeO2kT4+MVqObxtP/40x5vgHMI8yrc4Tp9O8eIbMW2fa/PhsMb85e5u/Pp/+b875H8VBaBARf9KJAAAAAElFTkSuQmCC"

// Input and output schemas, raw JSON so that both Go SDKs list the same definitions.
const (
	DocumentInput = `{"type":"object","properties":{"lines":{"type":"integer","minimum":1,"maximum":5000,` +
		`"default":600,"description":"how many lines to read"}}}`
	EmptyInput    = `{"type":"object","properties":{}}`
	WeatherOutput = `{"type":"object","properties":{"city":{"type":"string"},"conditions":{"type":"array",` +
		`"items":{"type":"string"},"maxItems":8},"humidity":{"type":"integer"},"temperature":{"type":"number"}},` +
		`"required":["city","conditions","humidity","temperature"]}`
)

var words = [...]string{"alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet", "kilo"}

// Line is line i of the document: varied words, so that no padding check flags it.
func Line(i int) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%05d", i)
	for k := range 8 {
		fmt.Fprintf(&b, " %s%d", words[(i*7+k*3)%len(words)], (i*k)%97)
	}
	return b.String()
}

// Document is the large text result: the heading and n lines, joined by newlines.
func Document(n int) string {
	parts := make([]string, 0, n+1)
	parts = append(parts, Heading)
	for i := range n {
		parts = append(parts, Line(i))
	}
	return strings.Join(parts, "\n")
}

// ImageBytes is ImagePNG decoded (an SDK that takes raw bytes encodes them again, to the same text).
func ImageBytes() []byte {
	data, err := base64.StdEncoding.DecodeString(ImagePNG)
	if err != nil {
		panic(err)
	}
	return data
}
