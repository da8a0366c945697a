package server

import (
	"net/http"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/orchard/orchard/api"
)

func (s *Server) snapshotRoutes() []route {
	return []route{
		{method: "POST", path: "/sandboxes/:id/snapshots", summary: "Snapshot a sandbox: its filesystem changes and a browser sandbox's browser state (cookies, storage, tabs, history, scroll, form values); it outlives the sandbox",
			request: api.SnapshotRequest{}, response: api.Snapshot{}, handler: s.takeSnapshot},
		{method: "GET", path: "/snapshots", summary: "List snapshots", response: api.SnapshotList{}, handler: s.listSnapshots},
		{method: "GET", path: "/snapshots/:snapshot_id", summary: "Get a snapshot", response: api.Snapshot{}, handler: s.getSnapshot},
		{method: "DELETE", path: "/snapshots/:snapshot_id", summary: "Delete a snapshot (sandboxes and snapshots that start from it keep working)",
			response: api.Snapshot{}, handler: s.deleteSnapshot},
		{method: "POST", path: "/sandboxes/:id/fork", summary: "Branch count new sandboxes off the sandbox's current state (files, browser state; not running processes); answers once all are ready",
			request: api.ForkRequest{}, response: api.ForkResponse{}, handler: s.fork},
	}
}

func (s *Server) takeSnapshot(c *gin.Context) error {
	var req api.SnapshotRequest
	if raw := body(c); len(raw) > 0 {
		if err := decodeJSON(raw, &req); err != nil {
			return err
		}
	}
	snap, err := s.mgr.Snapshot(c.Request.Context(), c.Param("id"), req)
	if err != nil {
		return err
	}
	c.JSON(http.StatusCreated, snap)
	return nil
}

func (s *Server) listSnapshots(c *gin.Context) error {
	list, err := s.mgr.Snapshots(c.Request.Context())
	if err != nil {
		return err
	}
	c.JSON(http.StatusOK, api.SnapshotList{Snapshots: list})
	return nil
}

func (s *Server) getSnapshot(c *gin.Context) error {
	snap, err := s.mgr.GetSnapshot(c.Request.Context(), c.Param("snapshot_id"))
	if err != nil {
		return err
	}
	c.JSON(http.StatusOK, snap)
	return nil
}

func (s *Server) deleteSnapshot(c *gin.Context) error {
	snap, err := s.mgr.GetSnapshot(c.Request.Context(), c.Param("snapshot_id"))
	if err != nil {
		return err
	}
	if err := s.mgr.DeleteSnapshot(c.Request.Context(), snap.SnapshotID); err != nil {
		return err
	}
	c.JSON(http.StatusOK, snap)
	return nil
}

func (s *Server) fork(c *gin.Context) error {
	start := time.Now()
	var req api.ForkRequest
	if err := decodeJSON(body(c), &req); err != nil {
		return err
	}
	recs, err := s.mgr.Fork(c.Request.Context(), c.Param("id"), req)
	if err != nil {
		return err
	}
	out := api.ForkResponse{SandboxID: c.Param("id"), Sandboxes: make([]api.Sandbox, 0, len(recs)),
		ForkMs: float64(time.Since(start).Microseconds()) / 1000}
	for _, r := range recs {
		out.Sandboxes = append(out.Sandboxes, s.sandboxJSON(r))
	}
	c.JSON(http.StatusOK, out)
	return nil
}
