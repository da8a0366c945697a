package browser

import "testing"

// Shift changes the key a chord presses, as on a keyboard: the page sees
// event.key "A" for Shift+a and "!" for Shift+1, and that text is typed.
func TestShiftedKeys(t *testing.T) {
	s := openPage(t, "/keys.html")
	mustDo(t, s, Action{Type: ActClick, Selector: "#in"})
	for _, c := range []struct{ keys, want string }{
		{"Shift+a", "A:KeyA:S"},
		{"Shift+1", "!:Digit1:S"},
		{"Control+Shift+z", "Z:KeyZ:CS"},
		{"Control+a", "a:KeyA:C"},
		{"b", "b:KeyB:"},
	} {
		js[any](t, s, "window.downs = []")
		mustDo(t, s, Action{Type: ActKey, Keys: c.keys})
		if got := js[[]string](t, s, "window.downs"); len(got) == 0 || got[len(got)-1] != c.want {
			t.Errorf("%s: keydowns %v, want the last %s", c.keys, got, c.want)
		}
	}
	if v := js[string](t, s, "document.getElementById('in').value"); v != "b" {
		t.Errorf("value %q, want b (Control+a selected A! before b replaced it)", v)
	}
	mustDo(t, s, Action{Type: ActKey, Keys: "Shift+a Shift+1"})
	if v := js[string](t, s, "document.getElementById('in').value"); v != "bA!" {
		t.Errorf("value %q, want bA!", v)
	}
}
