package edge

import "testing"

// Loops are counted per caller: one tenant holding MaxEgressLoop requests to a script open makes
// its own next call a loop, never another tenant's call to that script.
func TestLoopsAreCountedPerCaller(t *testing.T) {
	t.Parallel()
	h := &Handler{}
	var leaves []func()
	for range MaxEgressLoop {
		leave, ok := h.enterLoop("mallory", "victim")
		if !ok {
			t.Fatal("refused before the cap")
		}
		leaves = append(leaves, leave)
	}
	if _, ok := h.enterLoop("mallory", "victim"); ok {
		t.Fatal("the caller went past the cap")
	}
	leave, ok := h.enterLoop("alice", "victim")
	if !ok {
		t.Fatal("another caller's request to the script counted as mallory's loop")
	}
	leave()
	leaves[0]()
	if _, ok := h.enterLoop("mallory", "victim"); !ok {
		t.Fatal("a finished request did not free its place")
	}
}
