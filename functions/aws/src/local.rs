//! Local event sources (filled below).
