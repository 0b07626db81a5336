package messages

import (
	"errors"
	"fmt"
	"reflect"

	"github.com/asynkron/protoactor-go/remote"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/runtime/protoimpl"
	"google.golang.org/protobuf/types/descriptorpb"
)

// envelope is the one protobuf message this package puts on protoactor's
// wire: proto3 `message Envelope { bytes frame = 1; }` in package
// kvwarden.messages, carrying one frame (header + msgpack body, see
// codec.go).
//
// It is written in the shape protoc-gen-go produces, with the file
// descriptor built in Go below rather than generated, so that the build
// needs no protoc. A well-known type such as wrapperspb.BytesValue would
// carry the bytes just as well, but the receiving node's protobuf
// serializer instantiates the Go type registered for the name on the wire,
// and only a type of our own can implement remote.RootSerialized, which is
// what turns the envelope back into a plain struct before the target
// actor's mailbox.
type envelope struct {
	state         protoimpl.MessageState
	sizeCache     protoimpl.SizeCache
	unknownFields protoimpl.UnknownFields

	Frame []byte `protobuf:"bytes,1,opt,name=frame,proto3" json:"frame,omitempty"`
}

// EnvelopeTypeName is the protobuf full name of the envelope, as
// protoactor's MessageBatch.TypeNames carries it.
const EnvelopeTypeName = "kvwarden.messages.Envelope"

var envelopeMsgTypes = make([]protoimpl.MessageInfo, 1)

func init() {
	type x struct{}
	protoimpl.TypeBuilder{
		File: protoimpl.DescBuilder{
			GoPackagePath: reflect.TypeOf(x{}).PkgPath(),
			RawDescriptor: envelopeFileDescriptor(),
			NumMessages:   1,
		},
		GoTypes:           []any{(*envelope)(nil)},
		DependencyIndexes: []int32{0, 0, 0, 0, 0},
		MessageInfos:      envelopeMsgTypes,
	}.Build() // registers the type in protoregistry.GlobalTypes
}

// envelopeFileDescriptor is the serialized FileDescriptorProto of
// kvwarden/messages/envelope.proto.
func envelopeFileDescriptor() []byte {
	fd := &descriptorpb.FileDescriptorProto{
		Name:    proto.String("kvwarden/messages/envelope.proto"),
		Package: proto.String("kvwarden.messages"),
		Syntax:  proto.String("proto3"),
		MessageType: []*descriptorpb.DescriptorProto{{
			Name: proto.String("Envelope"),
			Field: []*descriptorpb.FieldDescriptorProto{{
				Name:     proto.String("frame"),
				JsonName: proto.String("frame"),
				Number:   proto.Int32(1),
				Label:    descriptorpb.FieldDescriptorProto_LABEL_OPTIONAL.Enum(),
				Type:     descriptorpb.FieldDescriptorProto_TYPE_BYTES.Enum(),
			}},
		}},
	}
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(fd)
	if err != nil {
		panic(fmt.Sprintf("messages: marshalling the envelope descriptor: %v", err))
	}
	return b
}

func (x *envelope) Reset() {
	*x = envelope{}
	mi := &envelopeMsgTypes[0]
	ms := protoimpl.X.MessageStateOf(protoimpl.Pointer(x))
	ms.StoreMessageInfo(mi)
}

func (x *envelope) String() string { return protoimpl.X.MessageStringOf(x) }

func (*envelope) ProtoMessage() {}

func (x *envelope) ProtoReflect() protoreflect.Message {
	mi := &envelopeMsgTypes[0]
	if x != nil {
		ms := protoimpl.X.MessageStateOf(protoimpl.Pointer(x))
		if ms.LoadMessageInfo() == nil {
			ms.StoreMessageInfo(mi)
		}
		return ms
	}
	return mi.MessageOf(x)
}

// Deserialize is called by protoactor's endpoint reader on the receiving
// node, on the gRPC stream's goroutine, before the message is sent to the
// target actor. An error here would make protoactor close the whole stream
// and lose the rest of the batch, so a frame that Decode refuses is
// delivered to the target as *Undecodable instead.
func (x *envelope) Deserialize() (remote.RootSerializable, error) {
	m, err := Decode(x.Frame)
	if err != nil {
		return &Undecodable{Bytes: len(x.Frame), Err: err}, nil
	}
	return m, nil
}

// Undecodable is delivered to an actor in place of a message that arrived
// from another node and that Decode refused; Err is Decode's typed error.
// The actor should count it and, if the message was a request
// (ctx.Sender() != nil), answer with ToWireError(Err) in its reply type.
// It only happens between builds that disagree about the protocol, or on
// corruption that TCP did not catch: senders validate before sending.
type Undecodable struct {
	Bytes int // size of the refused frame
	Err   error
}

func (u *Undecodable) Error() string {
	return fmt.Sprintf("messages: undecodable frame of %d bytes: %v", u.Bytes, u.Err)
}

func (u *Undecodable) Unwrap() error { return u.Err }

// ErrLocalOnly is returned when a value that exists only inside a node is
// sent to another node.
var ErrLocalOnly = errors.New("messages: Undecodable is local to a node and is never sent")

// Serialize refuses: an Undecodable is never forwarded.
func (u *Undecodable) Serialize() (remote.RootSerialized, error) { return nil, ErrLocalOnly }

// serialize is every message's remote.RootSerializable: protoactor's
// endpoint writer calls it for a message bound for another node. An error
// makes the writer log and drop that message only; the stream stays up.
func serialize(m Message) (remote.RootSerialized, error) {
	frame, err := Encode(m)
	if err != nil {
		return nil, err
	}
	return &envelope{Frame: frame}, nil
}

func (m *GenerateRequest) Serialize() (remote.RootSerialized, error) { return serialize(m) }
func (m *TokenChunk) Serialize() (remote.RootSerialized, error)      { return serialize(m) }
func (m *TokenBatch) Serialize() (remote.RootSerialized, error)      { return serialize(m) }
func (m *GenerateResult) Serialize() (remote.RootSerialized, error)  { return serialize(m) }
func (m *CancelRequest) Serialize() (remote.RootSerialized, error)   { return serialize(m) }
func (m *TransferPlan) Serialize() (remote.RootSerialized, error)    { return serialize(m) }
func (m *TransferAck) Serialize() (remote.RootSerialized, error)     { return serialize(m) }
func (m *TransferAbort) Serialize() (remote.RootSerialized, error)   { return serialize(m) }
func (m *TransferDone) Serialize() (remote.RootSerialized, error)    { return serialize(m) }
func (m *RoutedRequest) Serialize() (remote.RootSerialized, error)   { return serialize(m) }
func (m *StatusRequest) Serialize() (remote.RootSerialized, error)   { return serialize(m) }
func (m *StatusReply) Serialize() (remote.RootSerialized, error)     { return serialize(m) }
func (m *DrainRequest) Serialize() (remote.RootSerialized, error)    { return serialize(m) }
func (m *DrainReply) Serialize() (remote.RootSerialized, error)      { return serialize(m) }
func (m *PressureRequest) Serialize() (remote.RootSerialized, error) { return serialize(m) }
func (m *PressureReply) Serialize() (remote.RootSerialized, error)   { return serialize(m) }
