package engine

import (
	"fmt"
	"slices"
	"strings"
)

// ChatMessage is one message of a chat: its role, "system", "user" or
// "assistant", and its text.
type ChatMessage struct {
	Role, Content string
}

// ChatTemplate is the chat format of a model's tokenizer.chat_template,
// recognised as llama.cpp recognises one (llm_chat_detect_template): by
// llama.cpp's name for it, or by substrings of its Jinja source, which is
// never run. It renders a chat as llama.cpp's llm_chat_apply_template
// does, the assistant's turn opened at the end, and encodes it as
// llama.cpp encodes the rendered text with special tokens parsed, but for
// one thing: only the template's own text, with the roles system, user
// and assistant, may become the model's special tokens (<|im_start|>,
// </s>, …), found by their pieces in the vocabulary; a message's content,
// and any other role, is always text, whatever it holds, never cut at a
// special token, not even at one the vocabulary types user-defined (as
// some converters type <|im_start|>), which plain text is cut at: it is
// only merged, as SentencePiece merges text. A ChatTemplate is immutable
// and safe for concurrent use.
type ChatTemplate struct {
	format *chatFormat
	tok    *spmTokenizer
	// turnEnd is the token the format ends an assistant's turn with, when
	// the vocabulary has it and it is not the tokenizer's Stop; else -1.
	turnEnd int
	// markers are the special tokens the format writes: a chat's text
	// never becomes one, not even by merging pieces into it.
	markers map[int]bool
}

// chatFormat is one of llama.cpp's chat formats.
type chatFormat struct {
	name string
	// end is the text that ends an assistant's turn, "" for none.
	end    string
	render func(w *chatWriter, msgs []ChatMessage)
}

// DetectChatTemplate is the chat template src names for a model of
// tokenizer tok: src is a GGUF file's tokenizer.chat_template (Jinja
// source) or one of llama.cpp's template names ("chatml", "llama3", …).
// When there is none, it says why, a line for the log: src is empty, is
// no template llama.cpp recognises, is one it recognises that is not
// rendered here, or tok is not a GGUF file's tokenizer. The model's chats
// then take the plain template of the API that serves it.
func DetectChatTemplate(src string, tok Tokenizer) (*ChatTemplate, string) {
	const plain = "chats use the plain template"
	spm, ok := tok.(*spmTokenizer)
	switch name := chatTemplateName(src); {
	case src == "":
		return nil, "the model has no chat template (tokenizer.chat_template): " + plain
	case name == "":
		return nil, "the model's chat template is none that llama.cpp recognises: " + plain
	case chatFormats[name] == nil:
		return nil, fmt.Sprintf("the model's chat template is llama.cpp's %s, which is not rendered here: %s", name, plain)
	case !ok:
		return nil, fmt.Sprintf("the model's chat template is llama.cpp's %s, but its tokenizer is not a GGUF file's: %s", name, plain)
	default:
		c := &ChatTemplate{format: chatFormats[name], tok: spm, turnEnd: -1, markers: map[int]bool{}}
		if id, ok := spm.special.lookup(c.format.end); ok && id != spm.Stop() {
			c.turnEnd = id
		}
		// The markers are the special tokens the template writes, in a
		// chat of every role: no text of a chat may become one.
		var w chatWriter
		c.format.render(&w, []ChatMessage{{Role: "system", Content: "s"}, {Role: "user", Content: "u"},
			{Role: "assistant", Content: "a"}, {Role: "user", Content: "u"}})
		for _, f := range c.fragments(w) {
			if f.token >= 0 {
				c.markers[f.token] = true
			}
		}
		if c.turnEnd >= 0 {
			c.markers[c.turnEnd] = true
		}
		return c, ""
	}
}

// Name is llama.cpp's name of the template: "chatml", "llama2-sys", ….
func (c *ChatTemplate) Name() string { return c.format.name }

// Tokenizer is the tokenizer the template encodes with.
func (c *ChatTemplate) Tokenizer() Tokenizer { return c.tok }

// TurnEnd is the token that ends the assistant's turn, where it is not
// the tokenizer's Stop (<|im_end|>, <|eot_id|>, <end_of_turn> …): an
// answer ends there as at Stop. It is -1 when the turn ends at Stop (a
// llama2 template's </s>), or the vocabulary has no token for the end.
func (c *ChatTemplate) TurnEnd() int { return c.turnEnd }

// EncodeWithin is the prompt of msgs: BOS, then the rendered chat's
// tokens, the assistant's turn opened at the end. Unless it certainly
// encodes to more than limit tokens, which it says without encoding: then
// ids is nil and atLeast is a count over limit that the prompt has at
// least, as with EncodeWithin. It checks twice, at least PieceBytesMax
// bytes of text a token: once the chat is rendered (a list of the
// template's texts and the messages' contents, which are not copied), on
// BOS and the contents; then, the template's text cut at its special
// tokens, on BOS, those tokens and all the text.
func (c *ChatTemplate) EncodeWithin(msgs []ChatMessage, limit int) (ids []int, atLeast int) {
	var w chatWriter
	c.format.render(&w, msgs)
	content := 0
	for _, p := range w {
		if p.content {
			content += len(p.text)
		}
	}
	if atLeast = c.atLeast(0, content); atLeast > limit {
		return nil, atLeast
	}
	frags := c.fragments(w)
	tokens, text := 0, 0
	for _, f := range frags {
		if f.token >= 0 {
			tokens++
		} else {
			text += len(f.text)
		}
	}
	if atLeast = c.atLeast(tokens, text); atLeast > limit {
		return nil, atLeast
	}
	ids = c.tok.encode(frags, c.markers)
	return ids, len(ids)
}

// atLeast is the fewest tokens a prompt of BOS, tokens more, and text
// bytes of text can be: no token stands for more than PieceBytesMax of
// them.
func (c *ChatTemplate) atLeast(tokens, text int) int {
	return 1 + tokens + (text+c.tok.PieceBytesMax()-1)/c.tok.PieceBytesMax()
}

// fragments are the rendered chat w as the tokenizer encodes it: each run
// of the template's own text cut at the special tokens it holds, every
// run of text between them, the messages' included, joined into one
// fragment, which is merged whole: a message's content is never cut at a
// special token, not even one the vocabulary types user-defined, which
// any other text is cut at (Encode).
func (c *ChatTemplate) fragments(w chatWriter) []fragment {
	var frags []fragment
	var text, tmpl strings.Builder
	// cut moves the template's text into frags, its special tokens as
	// tokens, what is between them into text.
	cut := func() {
		for _, f := range c.tok.special.split(tmpl.String()) {
			if f.token < 0 {
				text.WriteString(f.text)
				continue
			}
			if text.Len() > 0 {
				frags = append(frags, fragment{text: text.String(), token: -1})
				text.Reset()
			}
			frags = append(frags, f)
		}
		tmpl.Reset()
	}
	for _, p := range w {
		if p.content {
			cut()
			text.WriteString(p.text)
		} else {
			tmpl.WriteString(p.text)
		}
	}
	cut()
	if text.Len() > 0 {
		frags = append(frags, fragment{text: text.String(), token: -1})
	}
	return frags
}

// chatWriter collects a rendered chat: the template's own text, and the
// messages' contents (and any role but system, user and assistant).
type chatWriter []chatPart

type chatPart struct {
	text    string
	content bool // a message's, never special tokens
}

// tmpl writes the template's own text.
func (w *chatWriter) tmpl(s ...string) {
	for _, x := range s {
		*w = append(*w, chatPart{text: x})
	}
}

// msg writes messages' contents, one after another.
func (w *chatWriter) msg(s ...string) {
	for _, x := range s {
		*w = append(*w, chatPart{text: x, content: true})
	}
}

// heldSystem is the system messages' text of a format without a system
// turn (gemma, orion), held for the next user turn, which it opens: as
// llama.cpp's system_prompt, each message's text appended, but as a list,
// so that a chat of many system messages is not copied once for each.
// What no user turn follows is left out, as llama.cpp leaves it: its
// llm_chat_apply_template writes system_prompt only into a user turn
// (gemma: a turn whose role is not "model"), and drops what is left when
// the chat ends.
type heldSystem []string

// add holds s, unless it is empty: text held is never empty.
func (h *heldSystem) add(s string) {
	if s != "" {
		*h = append(*h, s)
	}
}

// flush writes the text held, then "\n\n", and holds none; without any,
// nothing.
func (h *heldSystem) flush(w *chatWriter) {
	if len(*h) > 0 {
		w.msg(*h...)
		w.tmpl("\n\n")
		*h = nil
	}
}

// role writes a message's role, as the template's own text when it is
// system, user or assistant (which the template may write in its markers,
// "<|user|>"), else as content; title capitalises it (openchat's "User").
func (w *chatWriter) role(r string, title bool) {
	known := r == "system" || r == "user" || r == "assistant"
	if title && r != "" {
		r = strings.ToUpper(r[:1]) + r[1:]
	}
	if known {
		w.tmpl(r)
	} else {
		w.msg(r)
	}
}

// trimSpace is llama.cpp's trim: without the ASCII white space at either
// end (C's isspace).
func trimSpace(s string) string { return strings.Trim(s, " \t\n\v\f\r") }

// chatFormats are the formats rendered here, by llama.cpp's names, each as
// llama.cpp's llm_chat_apply_template writes it with add_ass (the
// assistant's turn opened at the end).
var chatFormats = func() map[string]*chatFormat {
	m := map[string]*chatFormat{}
	add := func(name, end string, render func(w *chatWriter, msgs []ChatMessage)) {
		m[name] = &chatFormat{name: name, end: end, render: render}
	}
	// Formats that write each message between a start and an end of its
	// own, then open the assistant's turn.
	each := func(name, end, open string, turn func(w *chatWriter, m ChatMessage)) {
		add(name, end, func(w *chatWriter, msgs []ChatMessage) {
			for _, m := range msgs {
				turn(w, m)
			}
			w.tmpl(open)
		})
	}
	each("chatml", "<|im_end|>", "<|im_start|>assistant\n", func(w *chatWriter, m ChatMessage) {
		w.tmpl("<|im_start|>")
		w.role(m.Role, false)
		w.tmpl("\n")
		w.msg(m.Content)
		w.tmpl("<|im_end|>\n")
	})
	each("phi4", "<|im_end|>", "<|im_start|>assistant<|im_sep|>", func(w *chatWriter, m ChatMessage) {
		w.tmpl("<|im_start|>")
		w.role(m.Role, false)
		w.tmpl("<|im_sep|>")
		w.msg(m.Content)
		w.tmpl("<|im_end|>")
	})
	for _, f := range []struct{ name, end, sep string }{{"phi3", "<|end|>", "<|end|>\n"}, {"zephyr", "<|endoftext|>", "<|endoftext|>\n"},
		{"falcon3", "", "\n"}, {"glmedge", "", ""}} {
		open := "<|assistant|>\n"
		if f.name == "glmedge" {
			open = "<|assistant|>"
		}
		each(f.name, f.end, open, func(w *chatWriter, m ChatMessage) {
			w.tmpl("<|")
			w.role(m.Role, false)
			w.tmpl("|>\n")
			w.msg(m.Content)
			w.tmpl(f.sep)
		})
	}
	each("llama3", "<|eot_id|>", "<|start_header_id|>assistant<|end_header_id|>\n\n", func(w *chatWriter, m ChatMessage) {
		w.tmpl("<|start_header_id|>")
		w.role(m.Role, false)
		w.tmpl("<|end_header_id|>\n\n")
		w.msg(trimSpace(m.Content))
		w.tmpl("<|eot_id|>")
	})
	each("megrez", "<|turn_end|>", "<|role_start|>assistant<|role_end|>", func(w *chatWriter, m ChatMessage) {
		w.tmpl("<|role_start|>")
		w.role(m.Role, false)
		w.tmpl("<|role_end|>")
		w.msg(m.Content)
		w.tmpl("<|turn_end|>")
	})
	each("command-r", "<|END_OF_TURN_TOKEN|>", "<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>", func(w *chatWriter, m ChatMessage) {
		tag, ok := map[string]string{"system": "<|SYSTEM_TOKEN|>", "user": "<|USER_TOKEN|>", "assistant": "<|CHATBOT_TOKEN|>"}[m.Role]
		if ok {
			w.tmpl("<|START_OF_TURN_TOKEN|>", tag)
			w.msg(trimSpace(m.Content))
			w.tmpl("<|END_OF_TURN_TOKEN|>")
		}
	})
	each("deepseek", "<|EOT|>", "### Response:\n", func(w *chatWriter, m ChatMessage) {
		switch m.Role {
		case "system":
			w.msg(m.Content)
		case "user":
			w.tmpl("### Instruction:\n")
			w.msg(m.Content)
			w.tmpl("\n")
		case "assistant":
			w.tmpl("### Response:\n")
			w.msg(m.Content)
			w.tmpl("\n<|EOT|>\n")
		}
	})
	for _, orca := range []bool{false, true} {
		name := "vicuna"
		if orca {
			name = "vicuna-orca"
		}
		each(name, "</s>", "ASSISTANT:", func(w *chatWriter, m ChatMessage) {
			switch {
			case m.Role == "system" && orca:
				w.tmpl("SYSTEM: ")
				w.msg(m.Content)
				w.tmpl("\n")
			case m.Role == "system":
				w.msg(m.Content)
				w.tmpl("\n\n")
			case m.Role == "user":
				w.tmpl("USER: ")
				w.msg(m.Content)
				w.tmpl("\n")
			case m.Role == "assistant":
				w.tmpl("ASSISTANT: ")
				w.msg(m.Content)
				w.tmpl("</s>\n")
			}
		})
	}
	each("openchat", "<|end_of_turn|>", "GPT4 Correct Assistant:", func(w *chatWriter, m ChatMessage) {
		if m.Role != "system" {
			w.tmpl("GPT4 Correct ")
			w.role(m.Role, true)
			w.tmpl(": ")
		}
		w.msg(m.Content)
		w.tmpl("<|end_of_turn|>")
	})
	add("monarch", "</s>", func(w *chatWriter, msgs []ChatMessage) {
		for i, m := range msgs {
			if i > 0 {
				w.tmpl("<s>")
			}
			w.role(m.Role, false)
			w.tmpl("\n")
			w.msg(m.Content)
			w.tmpl("</s>\n")
		}
		w.tmpl("<s>assistant\n")
	})
	add("gemma", "<end_of_turn>", func(w *chatWriter, msgs []ChatMessage) {
		var system heldSystem // no system turn: the next user turn opens with it
		for _, m := range msgs {
			if m.Role == "system" {
				system.add(trimSpace(m.Content))
				continue
			}
			w.tmpl("<start_of_turn>")
			if m.Role == "assistant" {
				w.tmpl("model\n")
			} else {
				w.role(m.Role, false)
				w.tmpl("\n")
				if m.Role != "model" { // llama.cpp asks of the role written
					system.flush(w)
				}
			}
			w.msg(trimSpace(m.Content))
			w.tmpl("<end_of_turn>\n")
		}
		w.tmpl("<start_of_turn>model\n")
	})
	add("orion", "</s>", func(w *chatWriter, msgs []ChatMessage) {
		var system heldSystem // no system turn either
		for _, m := range msgs {
			switch m.Role {
			case "system":
				system.add(m.Content)
			case "user":
				w.tmpl("Human: ")
				system.flush(w)
				w.msg(m.Content)
				w.tmpl("\n\nAssistant: </s>")
			default:
				w.msg(m.Content)
				w.tmpl("</s>")
			}
		}
	})
	for _, tekken := range []bool{false, true} {
		name, space := "mistral-v7", " "
		if tekken {
			name, space = "mistral-v7-tekken", ""
		}
		add(name, "</s>", func(w *chatWriter, msgs []ChatMessage) {
			for _, m := range msgs {
				switch m.Role {
				case "system":
					w.tmpl("[SYSTEM_PROMPT]" + space)
					w.msg(m.Content)
					w.tmpl("[/SYSTEM_PROMPT]")
				case "user":
					w.tmpl("[INST]" + space)
					w.msg(m.Content)
					w.tmpl("[/INST]")
				default:
					w.tmpl(space)
					w.msg(m.Content)
					w.tmpl("</s>")
				}
			}
		})
	}
	for _, v := range []struct {
		name, lead, trail string
		trim              bool
	}{{"mistral-v1", " ", " ", false}, {"mistral-v3", "", " ", true}, {"mistral-v3-tekken", "", "", false}} {
		add(v.name, "</s>", func(w *chatWriter, msgs []ChatMessage) {
			inTurn := false
			for _, m := range msgs {
				if !inTurn {
					w.tmpl(v.lead + "[INST]" + v.trail)
					inTurn = true
				}
				switch m.Role {
				case "system":
					w.msg(m.Content)
					w.tmpl("\n\n")
				case "user":
					w.msg(m.Content)
					w.tmpl(v.lead + "[/INST]")
				default:
					content := m.Content
					if v.trim {
						content = trimSpace(content)
					}
					w.tmpl(v.trail)
					w.msg(content)
					w.tmpl("</s>")
					inTurn = false
				}
			}
		})
	}
	for _, name := range []string{"llama2", "llama2-sys", "llama2-sys-bos", "llama2-sys-strip"} {
		add(name, "</s>", func(w *chatWriter, msgs []ChatMessage) {
			open := "[INST] "
			if name == "llama2-sys-bos" {
				open = "<s>[INST] " // BOS inside the history
			}
			w.tmpl("[INST] ")
			inTurn := true
			for _, m := range msgs {
				content := m.Content
				if name == "llama2-sys-strip" {
					content = trimSpace(content)
				}
				if !inTurn {
					w.tmpl(open)
					inTurn = true
				}
				switch m.Role {
				case "system":
					if name == "llama2" { // no system message: its text opens the first turn
						w.msg(content)
						w.tmpl("\n")
						continue
					}
					w.tmpl("<<SYS>>\n")
					w.msg(content)
					w.tmpl("\n<</SYS>>\n\n")
				case "user":
					w.msg(content)
					w.tmpl(" [/INST]")
				default:
					w.msg(content)
					w.tmpl("</s>")
					inTurn = false
				}
			}
		})
	}
	return m
}()

// chatTemplatesNamed are llama.cpp's names of the templates it renders and
// this does not.
var chatTemplatesNamed = []string{"smolvlm", "chatglm3", "chatglm4", "minicpm", "deepseek2", "deepseek3", "exaone3",
	"exaone4", "rwkv-world", "granite", "gigachat", "yandex", "bailing", "llama4", "dots1", "hunyuan-moe",
	"hunyuan-dense", "kimi-k2"}

// chatTemplateName is llama.cpp's name for the template src: src itself
// when it is one of llama.cpp's names, else the first format whose
// substrings src holds, in llama.cpp's order (llm_chat_detect_template);
// "" for none.
func chatTemplateName(src string) string {
	if chatFormats[src] != nil || slices.Contains(chatTemplatesNamed, src) {
		return src
	}
	has := func(subs ...string) bool {
		for _, s := range subs {
			if !strings.Contains(src, s) {
				return false
			}
		}
		return true
	}
	switch {
	case has("<|im_start|>"):
		switch {
		case has("<|im_sep|>"):
			return "phi4"
		case has("<end_of_utterance>"):
			return "smolvlm" // <|im_start|> as BOS, but no chatml
		}
		return "chatml"
	case strings.HasPrefix(src, "mistral") || has("[INST]"):
		switch {
		case has("[SYSTEM_PROMPT]"):
			return "mistral-v7"
		case has("' [INST] ' + system_message") || has("[AVAILABLE_TOOLS]"):
			switch {
			case has(" [INST]"):
				return "mistral-v1"
			case has(`"[INST]"`):
				return "mistral-v3-tekken"
			}
			return "mistral-v3"
		case has("content.strip()"):
			return "llama2-sys-strip"
		case has("bos_token + '[INST]"):
			return "llama2-sys-bos"
		case has("<<SYS>>"):
			return "llama2-sys"
		}
		return "llama2"
	case has("<|assistant|>", "<|end|>"):
		return "phi3"
	case has("[gMASK]<sop>"):
		return "chatglm4"
	case has("<|assistant|>", "<|user|>"):
		if has("</s>") {
			return "falcon3"
		}
		return "glmedge"
	case has("<|{{ item['role'] }}|>", "<|begin_of_image|>"):
		return "glmedge"
	case has("<|user|>", "<|endoftext|>"):
		return "zephyr"
	case has("bos_token + message['role']"):
		return "monarch"
	case has("<start_of_turn>"):
		return "gemma"
	case has(`'\n\nAssistant: ' + eos_token`):
		return "orion"
	case has("GPT4 Correct "):
		return "openchat"
	case has("USER: ", "ASSISTANT: "):
		if has("SYSTEM: ") {
			return "vicuna-orca"
		}
		return "vicuna"
	case has("### Instruction:", "<|EOT|>"):
		return "deepseek"
	case has("<|START_OF_TURN_TOKEN|>", "<|USER_TOKEN|>"):
		return "command-r"
	case has("<|start_header_id|>", "<|end_header_id|>"):
		return "llama3"
	case has("[gMASK]sop"):
		return "chatglm3"
	case has("<用户>"):
		return "minicpm"
	case has("'Assistant: ' + message['content'] + eos_token"):
		return "deepseek2"
	case has("<｜Assistant｜>", "<｜User｜>", "<｜end▁of▁sentence｜>"):
		return "deepseek3"
	case has("[|system|]", "[|assistant|]", "[|endofturn|]"):
		if has("[|tool|]") {
			return "exaone4"
		}
		return "exaone3"
	case has("rwkv-world") || has(`{{- 'User: ' + message['content']|trim + '\n\n' -}}`):
		return "rwkv-world"
	case has("<|start_of_role|>"):
		return "granite"
	case has("message['role'] + additional_special_tokens[0] + message['content'] + additional_special_tokens[1]"):
		return "gigachat"
	case has("<|role_start|>"):
		return "megrez"
	case has(" Ассистент:"):
		return "yandex"
	case has("<role>ASSISTANT</role>", "'HUMAN'"):
		return "bailing"
	case has("<|header_start|>", "<|header_end|>"):
		return "llama4"
	case has("<|endofuserprompt|>"):
		return "dots1"
	case has("<|startoftext|>", "<|extra_4|>"):
		return "hunyuan-moe"
	case has("<｜hy_place▁holder▁no▁2｜>", "<｜hy_place▁holder▁no▁3｜>"):
		return "hunyuan-dense"
	case has("<|im_assistant|>assistant<|im_middle|>"):
		return "kimi-k2"
	}
	return ""
}
