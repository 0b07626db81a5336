package kv

import "fmt"

// FreeList holds the tags of a pool's free pages and hands them out all or
// nothing. Each entry is the tag the page's next tenancy will have, as the
// page's free reported it. It is a pure value; the pool (or pool actor) that
// owns it pushes a page back exactly once per free.
type FreeList struct {
	tags     []Tag // a stack: the most recently freed page is reused first
	capacity int
}

// NewFreeList makes a free list for a pool whose pages' first tags are
// given, in the order they should be handed out.
func NewFreeList(first []Tag) FreeList {
	f := FreeList{tags: make([]Tag, 0, len(first)), capacity: len(first)}
	for i := len(first) - 1; i >= 0; i-- {
		f.tags = append(f.tags, first[i])
	}
	return f
}

// Len is the number of free pages.
func (f *FreeList) Len() int { return len(f.tags) }

// Capacity is the number of pages of the pool.
func (f *FreeList) Capacity() int { return f.capacity }

// Take removes n tags, all or nothing.
func (f *FreeList) Take(n int) ([]Tag, error) {
	if n < 1 {
		return nil, fmt.Errorf("kv: reserve of %d pages: want at least 1", n)
	}
	if n > len(f.tags) {
		return nil, &PoolExhaustedError{Need: n, Free: len(f.tags), Capacity: f.capacity}
	}
	out := make([]Tag, n)
	for i := range out {
		out[i] = f.tags[len(f.tags)-1-i]
	}
	f.tags = f.tags[:len(f.tags)-n]
	return out, nil
}

// Push returns a freed page's next tag. More pushes than the capacity mean
// a page was freed twice, which is a bug.
func (f *FreeList) Push(t Tag) {
	if len(f.tags) >= f.capacity {
		panic(fmt.Sprintf("kv: free list already holds all %d pages; push of %s", f.capacity, t))
	}
	f.tags = append(f.tags, t)
}
