package trust

// Pin and Unpin let the tests bind a stream to an address, as the remote
// guard does.
func (p *Peers) Pin(addr string) bool { return p.pin(addr) }
func (p *Peers) Unpin(addr string)    { p.unpin(addr) }
