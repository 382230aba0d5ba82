mod ffi;
mod sys;
