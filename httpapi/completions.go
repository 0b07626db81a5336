package httpapi

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"
)

// completionRequest is POST /v1/completions' body: the fields read, and
// those refused unless left at their default. Others (temperature, top_p,
// seed, user, …) are accepted and ignored: decoding is greedy.
type completionRequest struct {
	common
	Prompt json.RawMessage `json:"prompt"`
	Echo   bool            `json:"echo"`
	BestOf *int            `json:"best_of"`
	Suffix *string         `json:"suffix"`
}

// promptText reads "prompt": a string, or an array of exactly one string.
// Token ids are refused: the cluster takes text, and counts tokens itself.
func promptText(raw json.RawMessage) (string, *apiError) {
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return s, nil
	}
	var list []string
	if err := json.Unmarshal(raw, &list); err != nil {
		return "", badRequest("prompt", "prompt must be a string or an array of one string (token ids are not taken)")
	}
	if len(list) != 1 {
		return "", badRequest("prompt", "prompt is an array of %d strings; one prompt per request", len(list))
	}
	return list[0], nil
}

type completionChoice struct {
	Index        int     `json:"index"`
	Text         string  `json:"text"`
	Logprobs     any     `json:"logprobs"`
	FinishReason *string `json:"finish_reason"`
}

// response is the object (or, streamed, each chunk) a completion or chat
// completion answers with, its choices of type C.
type response[C any] struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Created int64  `json:"created"`
	Model   string `json:"model"`
	Choices []C    `json:"choices"`
	Usage   *usage `json:"usage,omitempty"`
}

// completions answers POST /v1/completions.
func (a *API) completions(w http.ResponseWriter, r *http.Request) {
	var req completionRequest
	key, e := a.begin(w, r, &req)
	if e != nil {
		writeError(w, e)
		return
	}
	switch {
	case len(req.Prompt) == 0 || string(req.Prompt) == "null":
		e = badRequest("prompt", "prompt is required")
	case req.Echo:
		e = badRequest("echo", "echo is not supported")
	case req.BestOf != nil && *req.BestOf != 1:
		e = badRequest("best_of", "best_of is %d; only one choice is generated", *req.BestOf)
	case req.Suffix != nil && *req.Suffix != "":
		e = badRequest("suffix", "suffix is not supported")
	}
	g, e := a.generation(key, &req.common, func() (string, *apiError) { return promptText(req.Prompt) }, req.MaxTokens, false, e)
	if e != nil {
		writeError(w, e)
		return
	}
	id, created, model := newID("cmpl-"), time.Now().Unix(), a.cfg.Model.Name()
	resp := func(choices []completionChoice, u *usage) response[completionChoice] {
		return response[completionChoice]{ID: id, Object: "text_completion", Created: created, Model: model, Choices: choices, Usage: u}
	}
	a.serveGeneration(w, r, g, &req.common,
		func(text string) any { return resp([]completionChoice{{Text: text}}, nil) },
		func(o outcome) any { return resp([]completionChoice{{FinishReason: &o.finish}}, nil) },
		func(u *usage) any { return resp([]completionChoice{}, u) },
		func(text string, o outcome) any {
			return resp([]completionChoice{{Text: text, FinishReason: &o.finish}}, usageOf(g, o))
		})
}

// chatRequest is POST /v1/chat/completions' body.
type chatRequest struct {
	common
	Messages            json.RawMessage `json:"messages"` // decoded by decodeList, at most ChatMessagesMax
	MaxCompletionTokens *int            `json:"max_completion_tokens"`
	ResponseFormat      *responseFormat `json:"response_format"`
}

type responseFormat struct {
	Type string `json:"type"`
}

type chatMessage struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
}

// text is a message's content: a string, or an array of text parts, each
// checked and taken as it is decoded (none kept, however many the body
// holds).
func (m chatMessage) text() (string, error) {
	var s string
	if err := json.Unmarshal(m.Content, &s); err == nil {
		return s, nil
	}
	type part struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	var b strings.Builder
	i := 0
	err := decodeEach(m.Content, func(p part) error {
		if p.Type != "text" {
			return &partTypeError{Part: i, Type: p.Type}
		}
		b.WriteString(p.Text)
		i++
		return nil
	})
	var typed *partTypeError
	switch {
	case errors.As(err, &typed):
		return "", err
	case err != nil:
		return "", fmt.Errorf("content must be a string or an array of text parts")
	}
	return b.String(), nil
}

// partTypeError is a chat message's content part of a type not taken.
type partTypeError struct {
	Part int
	Type string
}

func (e *partTypeError) Error() string {
	return fmt.Sprintf("content part %d is of type %q; only text is taken", e.Part, e.Type)
}

// chatRoles are the roles a message may have, as the template names them.
var chatRoles = map[string]string{"system": "System", "developer": "System", "user": "User", "assistant": "Assistant"}

// ChatTurnStop is the stop sequence every chat completion has besides its
// own: the start of the next user turn in ChatPrompt's template.
const ChatTurnStop = "\nUser:"

// ChatPrompt is the text a chat becomes for a model without a chat
// template of its own: each message on its own line as "Role: content"
// (System, User or Assistant), then "Assistant:" for the model to go on
// from. The model's answer ends at its end of sequence or at the next
// "\nUser:".
//
//	System: You are terse.
//	User: Hello!
//	Assistant:
func ChatPrompt(msgs []chatMessage) (string, *apiError) {
	var b strings.Builder
	for i, m := range msgs {
		role, ok := chatRoles[m.Role]
		if !ok {
			return "", badRequest(fmt.Sprintf("messages[%d].role", i), "role %q; want system, developer, user or assistant", m.Role)
		}
		text, err := m.text()
		if err != nil {
			return "", badRequest(fmt.Sprintf("messages[%d].content", i), "%v", err)
		}
		b.WriteString(role)
		b.WriteString(": ")
		b.WriteString(text)
		b.WriteString("\n")
	}
	b.WriteString("Assistant:")
	return b.String(), nil
}

type chatDelta struct {
	Role    string  `json:"role,omitempty"`
	Content *string `json:"content,omitempty"`
}

type chatChoice struct {
	Index        int        `json:"index"`
	Message      *chatReply `json:"message,omitempty"`
	Delta        *chatDelta `json:"delta,omitempty"`
	Logprobs     any        `json:"logprobs"`
	FinishReason *string    `json:"finish_reason"`
}

type chatReply struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

// chat answers POST /v1/chat/completions.
func (a *API) chat(w http.ResponseWriter, r *http.Request) {
	var req chatRequest
	key, e := a.begin(w, r, &req)
	if e != nil {
		writeError(w, e)
		return
	}
	var msgs []chatMessage
	if len(req.Messages) > 0 && string(req.Messages) != "null" {
		var err error
		var long *listTooLongError
		if msgs, err = decodeList[chatMessage](req.Messages, a.limits.ChatMessagesMax); errors.As(err, &long) {
			e = badRequest("messages", "more than %d messages", long.Max)
		} else if err != nil {
			e = badRequest("messages", "messages must be an array of messages: %v", err)
		}
	}
	switch {
	case e != nil:
	case len(msgs) == 0:
		e = badRequest("messages", "messages is required")
	case req.ResponseFormat != nil && req.ResponseFormat.Type != "" && req.ResponseFormat.Type != "text":
		e = badRequest("response_format", "response_format %q; only text", req.ResponseFormat.Type)
	case req.MaxTokens != nil && req.MaxCompletionTokens != nil && *req.MaxTokens != *req.MaxCompletionTokens:
		e = badRequest("max_completion_tokens", "max_tokens (%d) and max_completion_tokens (%d) differ", *req.MaxTokens,
			*req.MaxCompletionTokens)
	}
	maxTokens := req.MaxTokens
	if req.MaxCompletionTokens != nil {
		maxTokens = req.MaxCompletionTokens
	}
	g, e := a.generation(key, &req.common, func() (string, *apiError) { return ChatPrompt(msgs) }, maxTokens, true, e)
	if e != nil {
		writeError(w, e)
		return
	}
	id, created, model := newID("chatcmpl-"), time.Now().Unix(), a.cfg.Model.Name()
	chunk := func(c []chatChoice, u *usage) response[chatChoice] {
		return response[chatChoice]{ID: id, Object: "chat.completion.chunk", Created: created, Model: model, Choices: c, Usage: u}
	}
	first := true
	a.serveGeneration(w, r, g, &req.common,
		func(text string) any {
			d := &chatDelta{Content: &text}
			if first {
				d.Role, first = "assistant", false
			}
			return chunk([]chatChoice{{Delta: d}}, nil)
		},
		func(o outcome) any { return chunk([]chatChoice{{Delta: &chatDelta{}, FinishReason: &o.finish}}, nil) },
		func(u *usage) any { return chunk([]chatChoice{}, u) },
		func(text string, o outcome) any {
			return response[chatChoice]{ID: id, Object: "chat.completion", Created: created, Model: model, Usage: usageOf(g, o),
				Choices: []chatChoice{{Message: &chatReply{Role: "assistant", Content: text}, FinishReason: &o.finish}}}
		})
}
