package httpapi

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/kvwarden/kvwarden/engine"
	"github.com/kvwarden/kvwarden/handoff"
)

// promptText reads "prompt": a string, or an array of exactly one string.
// Token ids are refused: the cluster takes text, and counts tokens itself.
// So is a text that starts with U+FDD0, a noncharacter, which would read
// as tokens (handoff.TokenPrompt).
func promptText(raw json.RawMessage) (string, *apiError) {
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		var list []string
		if err := json.Unmarshal(raw, &list); err != nil {
			return "", badRequest("prompt", "prompt must be a string or an array of one string (token ids are not taken)")
		}
		if len(list) != 1 {
			return "", badRequest("prompt", "prompt is an array of %d strings; one prompt per request", len(list))
		}
		s = list[0]
	}
	if handoff.IsTokenPrompt(s) {
		return "", badRequest("prompt", "prompt starts with U+FDD0, a noncharacter this API keeps for prompts of token ids, which it does not take")
	}
	return s, nil
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
	g, e := a.generation(key, &req.common, fields{prompt: "prompt", maxTokens: "max_tokens"},
		func() (string, *apiError) { return promptText(req.Prompt) }, req.MaxTokens)
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

// chatMessages decodes "messages", at most ChatMessagesMax of them.
func (a *API) chatMessages(raw json.RawMessage) ([]chatMessage, *apiError) {
	if len(raw) == 0 || string(raw) == "null" {
		return nil, badRequest("messages", "messages is required")
	}
	msgs, err := decodeList[chatMessage](raw, a.limits.ChatMessagesMax)
	var long *listTooLongError
	switch {
	case errors.As(err, &long):
		return nil, badRequest("messages", "messages has more than %d messages, the bound", long.Max)
	case err != nil:
		return nil, jsonError("messages", err)
	case len(msgs) == 0:
		return nil, badRequest("messages", "messages is empty; want at least one message")
	}
	return msgs, nil
}

// chatRoles are the roles a message may have, as ChatPrompt's template
// names them; a model's own template takes them in lower case.
var chatRoles = map[string]string{"system": "System", "developer": "System", "user": "User", "assistant": "Assistant"}

// chatTurns checks msgs and returns them as a chat template takes them:
// each its role (system, user or assistant: developer is system) and its
// text.
func chatTurns(msgs []chatMessage) ([]engine.ChatMessage, *apiError) {
	turns := make([]engine.ChatMessage, len(msgs))
	for i, m := range msgs {
		path := fmt.Sprintf("messages[%d]", i)
		role, ok := chatRoles[m.Role]
		if !ok {
			return nil, badRequest(path+".role", "%s.role is %q; want system, developer, user or assistant", path, m.Role)
		}
		if e := m.check(path); e != nil {
			return nil, e
		}
		text, e := m.text(path + ".content")
		if e != nil {
			return nil, e
		}
		turns[i] = engine.ChatMessage{Role: strings.ToLower(role), Content: text}
	}
	return turns, nil
}

// ChatTurnStop is the stop sequence every chat completion in ChatPrompt's
// template has besides its own: the start of the next user turn.
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
	turns, e := chatTurns(msgs)
	if e != nil {
		return "", e
	}
	var b strings.Builder
	for _, m := range turns {
		b.WriteString(chatRoles[m.Role])
		b.WriteString(": ")
		b.WriteString(m.Content)
		b.WriteString("\n")
	}
	b.WriteString("Assistant:")
	return b.String(), nil
}

// templatePrompt is the prompt msgs become in the model's own chat
// template ct: its tokens (handoff.TokenPrompt), which the cluster takes
// as they are, so that no message's text becomes one of the template's
// control tokens. A chat over the context window is refused, unencoded
// when it certainly is.
func (a *API) templatePrompt(ct *engine.ChatTemplate, msgs []chatMessage) (string, *apiError) {
	turns, e := chatTurns(msgs)
	if e != nil {
		return "", e
	}
	limit := a.cfg.Node.ContextTokens
	ids, n := ct.EncodeWithin(turns, limit)
	if n > limit {
		return "", windowTooLong("messages", n, limit, ids == nil)
	}
	return handoff.TokenPrompt(ids), nil
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
	msgs, e := a.chatMessages(req.Messages)
	if e == nil && req.MaxTokens != nil && req.MaxCompletionTokens != nil && *req.MaxTokens != *req.MaxCompletionTokens {
		e = badRequest("max_completion_tokens", "max_tokens (%d) and max_completion_tokens (%d) differ", *req.MaxTokens,
			*req.MaxCompletionTokens)
	}
	if e != nil {
		writeError(w, e)
		return
	}
	f, maxTokens := fields{prompt: "messages", maxTokens: "max_tokens", chat: true}, req.MaxTokens
	if req.MaxCompletionTokens != nil {
		f.maxTokens, maxTokens = "max_completion_tokens", req.MaxCompletionTokens
	}
	prompt := func() (string, *apiError) { return ChatPrompt(msgs) }
	if ct := a.cfg.ChatTemplate; ct != nil {
		prompt = func() (string, *apiError) { return a.templatePrompt(ct, msgs) }
	}
	g, e := a.generation(key, &req.common, f, prompt, maxTokens)
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
