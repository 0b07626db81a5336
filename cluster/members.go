package cluster

import "github.com/kvwarden/kvwarden/cluster/membership"

// The names of package membership that the router, the data plane's
// wiring and the watch loop read on every path, so that those files say
// Member and RoleDecode as the rest of the package does.
type (
	Member = membership.Member
	Role   = membership.Role
)

const (
	RolePrefill = membership.RolePrefill
	RoleDecode  = membership.RoleDecode
	RoleRouter  = membership.RoleRouter
	RoleAll     = membership.RoleAll
	StateAlive  = membership.StateAlive
)
