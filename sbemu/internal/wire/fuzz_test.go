package wire

import (
	"bytes"
	"testing"
)

// FuzzDecodeValue checks DecodeValue never panics and that whatever it
// decodes re-encodes to bytes that decode to an equal value, and that this
// second encoding is stable.
func FuzzDecodeValue(f *testing.F) {
	for _, tc := range goldenCases {
		b, err := AppendValue(nil, tc.v)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	for _, tc := range performativeCases {
		b, err := AppendValue(nil, tc.v)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte{0xe0, 0x05, 0x02, 0x00, 0x53, 0x24, 0x45})
	f.Fuzz(func(t *testing.T, in []byte) {
		v, _, err := DecodeValue(in)
		if err != nil {
			return
		}
		enc, err := AppendValue(nil, v)
		if err != nil {
			t.Fatalf("decoded %#v but cannot re-encode it: %v", v, err)
		}
		v2, rest, err := DecodeValue(enc)
		if err != nil {
			t.Fatalf("re-encoded % x does not decode: %v", enc, err)
		}
		if len(rest) != 0 {
			t.Fatalf("re-encoding left %d bytes", len(rest))
		}
		if !Equal(v, v2) {
			t.Fatalf("round trip changed the value:\n%#v\n%#v", v, v2)
		}
		enc2, err := AppendValue(nil, v2)
		if err != nil || !bytes.Equal(enc, enc2) {
			t.Fatalf("encoding is not stable: % x vs % x (%v)", enc, enc2, err)
		}
	})
}

// FuzzReadFrame checks ReadFrame never panics and that every frame it accepts
// writes back into a frame it reads as equal.
func FuzzReadFrame(f *testing.F) {
	seeds := []Frame{{Type: FrameAMQP}}
	for _, tc := range performativeCases {
		seeds = append(seeds, Frame{Type: FrameAMQP, Channel: 1, Body: tc.v})
	}
	for _, tc := range saslCases {
		seeds = append(seeds, Frame{Type: FrameSASL, Body: tc.v})
	}
	seeds = append(seeds, Frame{Type: FrameAMQP, Body: &Transfer{Handle: 1, Payload: []byte("payload")}})
	for _, s := range seeds {
		b, err := AppendFrame(nil, s)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		fr, err := ReadFrame(bytes.NewReader(in), 4096)
		if err != nil {
			return
		}
		out, err := AppendFrame(nil, fr)
		if err != nil {
			t.Fatalf("read %#v but cannot write it: %v", fr, err)
		}
		fr2, err := ReadFrame(bytes.NewReader(out), uint32(max(len(out), 512)))
		if err != nil {
			t.Fatalf("written frame % x does not read back: %v", out, err)
		}
		if !Equal(fr, fr2) {
			t.Fatalf("frame changed:\n%#v\n%#v", fr, fr2)
		}
	})
}
